/*
 * engine.h: the serving engine of gdp-run: a stream of requests (a workload) served through
 * a GDP model (model.h) on every rank of a tensor-parallel group, with
 *   - continuous batching under a token budget per step: decode tokens of the running
 *     requests and chunked-prefill slices of new prompts share one step;
 *   - state slots from the distributed cache (cache.h), one per live request;
 *   - preemption when a request has waited preempt_wait_ms for a slot and every slot is
 *     taken: a running request's slot state (this rank's share, every layer) is swapped to
 *     device memory (CUDA, swap_on_device) or pinned host memory (gdp_cache_swap_out), the slot
 *     is released, and the request resumes later from exactly that state;
 *   - optional draft tokens from an n-gram drafter (prompt lookup), verified against the
 *     sampled tokens in one decode step of S = 1 + drafts tokens and rolled back to the kept;
 *   - sampling on the device (greedy, temperature, top-k, top-p with per-request seeds,
 *     sampling.h) behind a vocab-parallel LM head; per-request stop token ids;
 *   - the whole device step (embedding gather, layers, head, sampling) as one CUDA graph
 *     per bucket (decode requests, prefill tokens, S), captured once and replayed;
 *   - measured phases (events on the stream), the steps' floor, a progress line and an
 *     end-of-run report.
 * Rank 0 of the comm (the root) schedules: each step it broadcasts the frame (swap
 * operations, row tokens, the head's rows and sampling parameters) and the step plan
 * (plan.h); every rank then applies the same step to its cache and runs the device step;
 * only sampled token ids, margins and flags come back to the root. docs/gdp-run.md
 * describes the step pipeline, the workload format, the scheduler and the report.
 *
 * The workloads it serves are in workload.h.
 */
#ifndef GDP_ENGINE_H
#define GDP_ENGINE_H

#include <stdio.h>

#include "gdp/comm.h"
#include "gdp/gdp.h"
#include "gdp/model.h"
#include "gdp/workload.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rates a step's floor is computed with (gdp_engine_report.floor_s): the H200's measured
 * copy bandwidth (bytes read + written) and dense bf16 matrix rate (docs/performance.md). */
#define GDP_FLOOR_BANDWIDTH 4.17e12
#define GDP_FLOOR_PEAK      7.9e14

/* ==== the engine ======================================================================== */

typedef struct gdp_engine *gdp_engine_t;
#define GDP_ENGINE_NULL NULL

/* Why a request's generation ended. */
typedef enum gdp_finish_reason {
    GDP_FINISH_LENGTH = 0, /* it generated max_new_tokens                                  */
    GDP_FINISH_STOP,       /* it emitted one of its stop token ids (the last token)        */
    GDP_FINISH_ERROR       /* the engine failed it (gdp_request_result.error says why)     */
} gdp_finish_reason;

struct gdp_request_result;
/* Called on the root as each request finishes (finish order), e.g. to stream results to a
 * file so that a killed run keeps what finished. The result is valid during the call. */
typedef void (*gdp_engine_result_fn)(const struct gdp_request_result *result, void *user);

/* The order in which waiting requests are admitted to free slots (their first prefill
 * slice). Running prefills, decodes and resumes are not reordered. */
typedef enum gdp_schedule {
    GDP_SCHEDULE_FCFS = 0,     /* arrival order                                                 */
    GDP_SCHEDULE_SHORTEST = 1  /* shortest prompt first (ties in arrival order), except that a
                                  request which has waited schedule_age_ms goes first, in
                                  arrival order: the backlog's mean time to first token falls
                                  and no prompt waits behind shorter ones for longer than that  */
} gdp_schedule;

typedef struct gdp_engine_config {
    int32_t n_slots;              /* requests holding a state slot at once (>= 1)                  */
    int32_t max_step_tokens;      /* token budget of a step: decode tokens + prefill tokens; must
                                     hold n_slots * (1 + draft_tokens) + prefill_chunk             */
    int32_t prefill_chunk;        /* prefill slice length, a multiple of 64 (slices start at
                                     64-token boundaries of the prompt); 0: a whole prompt per
                                     slice (it must then fit the budget)                           */
    int32_t max_prefill_requests; /* prefill slices per step (0: n_slots)                          */
    int32_t draft_tokens;         /* n-gram draft tokens per decode request and step (0: off)      */
    int32_t ngram;                /* the drafter matches the last ngram .. 2 tokens                */
    int32_t preempt;              /* 1: preempt running requests when others wait for a slot       */
    int32_t preempt_after;        /* decode steps a request runs after (re)admission before it
                                     may be preempted (>= 1; keeps preemption from thrashing)      */
    int32_t preempt_wait_ms;      /* a waiting request's turn comes (a running one is swapped out
                                     for it) once it has waited this long for a slot; 0: at once  */
    int32_t schedule;             /* gdp_schedule: the admission order of waiting requests          */
    int32_t schedule_age_ms;      /* GDP_SCHEDULE_SHORTEST: a request that has waited this long is
                                     admitted before shorter ones (>= 0; 0: arrival order)         */
    int32_t max_candidates;       /* sampling candidates per rank and row (sampling.h): the largest
                                     top_k a request may ask for, and top-p's reach (1 .. 1024)   */
    int32_t cuda_graphs;          /* 1: each step runs its layers as the CUDA graph of its bucket
                                     (decode requests, prefill tokens, S), captured at init
                                     (graphs_at_init) or on the bucket's first step and
                                     replayed after (CUDA with NCCL or
                                     tp = 1; init runs one eager step of the largest bucket first
                                     so the layers' workspaces never move). On the CPU, or over a
                                     host-staged MPI comm, the hooks only count captures and
                                     replays and the layers run eagerly.                         */
    int32_t honor_arrivals;       /* 1: a request joins at its arrival time; 0: all at the start   */
    int32_t progress;             /* seconds between progress lines on stderr (root); 0: none      */
    int32_t check_requests;       /* keep the last logits of this many requests for gdp_engine_check */
    int32_t debug_check;          /* 1: the plan hash-checks every step's metadata across ranks    */
    int32_t overlap;              /* 1: the root composes step n + 1 while the device runs step n
                                     (docs/gdp-run.md, "The step pipeline"); steps with drafts,
                                     and composes that depend on step n (a preemption), wait
                                     first. 0: one step at a time. Tokens are the same either way */
    gdp_engine_result_fn on_result; /* NULL: none                                                */
    void   *on_result_user;
    int32_t graphs_at_init;       /* with cuda_graphs where graphs are captured: 1 captures every
                                     bucket's graph at init (a capture costs 2-13 ms of host time
                                     that would stall the first steps of each shape, the device
                                     idle meanwhile); 0 captures each on the bucket's first step */
    gdp_dtype_t ssm_dtype;        /* the cache's recurrent state: GDP_DTYPE_FP32 (the default) or
                                     GDP_DTYPE_BF16 (half the decode step's state bytes; the
                                     drift it adds: docs/gdp-run.md, "The state dtype")          */
    int32_t swap_on_device;       /* CUDA: 1 keeps preempted requests' states in device memory
                                     (device-to-device copies in stream order: a swap costs the
                                     host no wait), 0 in pinned host memory (each swap waits for
                                     its copies). No effect on the CPU backend                  */
} gdp_engine_config;

/* gdp-run's defaults: 16 slots, 512 tokens per step, prefill chunk 256, no drafts (ngram 3),
 * preemption of requests that ran 16 decode steps for waiters that waited 2 s, shortest
 * prompt first with a 2 s age bound, 256
 * sampling candidates, graphs on (captured at init), arrivals honored, progress every second,
 * no check, no debug check, overlap on, an fp32 recurrent state, swaps in device memory. */
GDP_API gdp_status_t gdp_engine_config_default(gdp_engine_config *cfg);

/* Creates an engine over a model (gdp_model_init with the same ctx and comm): the state
 * cache (n_slots slots, draft states when draft_tokens > 0), the step plan with its
 * buckets, the step buffers and the head's buffers, then runs one warm-up step of the
 * largest bucket (so no buffer moves under a captured graph). Collective over comm (NULL: one process). Errors (nothing allocated, the
 * same on every rank): INVALID_ARGUMENT naming the config field and values (e.g. a
 * budget smaller than n_slots * (1 + draft_tokens) + prefill_chunk), or a comm whose size
 * is not the model's TP size; errors of the cache and plan. */
GDP_API gdp_status_t gdp_engine_init(gdp_engine_t *out, gdp_ctx_t ctx, gdp_comm_t comm, gdp_model_t model,
                                     const gdp_engine_config *config);
/* Frees the engine (not the model). NULL is a no-op. */
GDP_API gdp_status_t gdp_engine_free(gdp_engine_t engine);

/* Serves the workload until every request has generated its max_new_tokens, then frees
 * every slot. Collective over the comm: the root (rank 0 of the comm) passes the workload,
 * the other ranks NULL (ignored). Replaces the results of an earlier run. Errors, on every
 * rank (the root's message reaches the others as REMOTE_ERROR): INVALID_ARGUMENT for a
 * workload the engine cannot serve (a token outside the vocabulary, a whole-prompt slice
 * larger than the budget, arrivals out of order: named with the request id), checked before
 * anything changes (the earlier run's results stay); errors of the steps. */
GDP_API gdp_status_t gdp_engine_run(gdp_engine_t engine, const gdp_workload *workload);

/* Phases of a step's time (gdp_engine_report.phase_s). */
typedef enum gdp_engine_phase {
    GDP_PHASE_GEMM = 0,   /* the layers' in_proj and out_proj GEMMs and the LM head         */
    GDP_PHASE_GDP_OPS,    /* conv, prepare, chunked / recurrent GDP, norms (the layers' rest) */
    GDP_PHASE_COLLECTIVE, /* the layers' all-reduces and status agreements, step broadcasts  */
    GDP_PHASE_HEAD,       /* the LM head and sampling (final norm, GEMM, candidates, merge)  */
    GDP_PHASE_HOST,       /* scheduling, frame and plan, swaps, emission: the step's wall
                             time the device was not busy with it                          */
    GDP_PHASE_NUM         /* must be last */
} gdp_engine_phase_t;
/* "GEMMs", "GDP ops", "collectives", "head + sampling", "host" or "invalid". */
GDP_API const char *gdp_engine_phase_name(gdp_engine_phase_t phase);

/* What a run did, as seen by this rank (request statistics on the root only). */
typedef struct gdp_engine_report {
    int32_t tp_size;
    int32_t requests;                 /* finished requests                                    */
    int64_t prompt_tokens, generated_tokens;
    double  wall_s;                   /* first step to last                                   */
    double  idle_s;                   /* of which the root slept waiting for arrivals         */
    double  generated_per_s, tokens_per_s, requests_per_s;
    double  ttft_p50_s, ttft_p99_s;   /* time to first token (from arrival)                   */
    double  tpot_p50_s, tpot_p99_s;   /* per request: (last token - first token) / (n - 1)    */
    double  itl_p50_s, itl_p99_s;     /* gaps between consecutive tokens of a request         */
    int64_t steps, decode_only_steps, prefill_only_steps, mixed_steps;
    int32_t buckets_used;
    int64_t preemptions, resumes;
    int64_t drafts_proposed, drafts_accepted;
    int64_t graph_captures, graph_replays; /* in the run (a shape's first capture)         */
    int64_t overlapped_steps;         /* device steps composed while the previous one ran     */
    double  phase_s[GDP_PHASE_NUM];   /* this rank, summed over the steps: device phases from
                                         CUDA events on the stream (clocks on the CPU), split
                                         by the marks of every eager step (every step on the
                                         CPU) and of every 8th launch of a CUDA graph, scaled
                                         to the device time; host = step wall time minus
                                         device time                                          */
    double  step_s;                   /* sum of the phases                                    */
    double  device_s;                 /* device time of the steps (events; CPU: layers+head)  */
    double  floor_s;                  /* the steps' floor: per step max(bytes / bandwidth,
                                         FLOPs / peak) at GDP_FLOOR_BANDWIDTH / GDP_FLOOR_PEAK */
    double  floor_bytes, floor_flops; /* what the floor counts, summed over the steps         */
    size_t  weight_bytes, cache_bytes, swap_peak_bytes, peak_rss_bytes, device_bytes;
    int32_t graphs_at_init;           /* buckets whose graphs init captured (graphs_at_init)  */
    double  graphs_init_s;            /* the host time those captures took                   */
} gdp_engine_report;

/* The report of the last run (collective: it gathers nothing, but call it on every rank
 * for symmetry with gdp_engine_print_report). */
GDP_API gdp_status_t gdp_engine_get_report(gdp_engine_t engine, gdp_engine_report *report);
/* Prints the report (root) with the memory of every rank (gathered over the comm).
 * Collective. `title` heads the report (e.g. the model and workload). */
GDP_API gdp_status_t gdp_engine_print_report(gdp_engine_t engine, FILE *out, const char *title);

/* One request's outcome (root only, valid until the next run or gdp_engine_free). */
typedef struct gdp_request_result {
    int32_t        index;        /* the request's place in the workload                            */
    int64_t        id;
    int32_t        prompt_len;
    int32_t        n_generated;
    const int32_t *tokens;       /* [n_generated] greedy tokens                                  */
    const float   *margin;       /* [n_generated] top-1 minus top-2 logit of each token's logits */
    const float   *logit_scale;  /* [n_generated] max |logit| of those logits                    */
    double         arrival_s, first_token_s, finish_s; /* seconds after the run started          */
    int32_t        preemptions;
    int32_t        drafts_proposed, drafts_accepted;
    int32_t        finish_reason; /* why generation ended (gdp_finish_reason)                     */
    const char    *error;        /* GDP_FINISH_ERROR: what went wrong (e.g. non-finite logits)     */
} gdp_request_result;

/* Result `index` (workload order) of the last run. INVALID_USAGE off the root. */
GDP_API gdp_status_t gdp_engine_get_result(gdp_engine_t engine, int32_t index, gdp_request_result *out);
/* Writes every request's generated tokens as JSONL (root): {"id", "prompt_len", "tokens",
 * "ttft_s", "latency_s", "preemptions"}. SYSTEM_ERROR when the file cannot be written. */
GDP_API gdp_status_t gdp_engine_write_results(gdp_engine_t engine, const char *path);

/* Decode vs recompute (the walk-through's self check, gdp-math.md 8.1): for the first
 * config.check_requests requests of the last run, prefills prompt + generated tokens but
 * the last in fresh slots and compares the logits at the last position with the logits
 * the run produced there (by decode steps). Collective. On the root:
 *   *worst = the largest max|a - b| / max|b| over those requests (bar: 1e-4 on the CPU),
 *   *mismatches = requests whose greedy token differs although the logits' top-2 margin
 *                 is at least bar * max|logit|.
 * INVALID_USAGE when the last run kept no logits (check_requests was 0). */
GDP_API gdp_status_t gdp_engine_check(gdp_engine_t engine, double *worst, int32_t *checked, int32_t *mismatches);

#ifdef __cplusplus
}
#endif

#endif /* GDP_ENGINE_H */
