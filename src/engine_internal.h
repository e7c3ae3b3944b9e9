/*
 * engine_internal.h: what the serving engine's files share (include/gdp/engine.h is the
 * API): the root's request and run state, the step frame the root broadcasts, the engine
 * struct, and the functions each file gives the others:
 *   engine.c         init / free, the step loop (pipelined: docs/gdp-run.md, "The step
 *                    pipeline"), the device step (graphs), run, check
 *   engine_sched.c   the root's run state, buckets, the n-gram drafter, compose (admission,
 *                    preemption policy, resumes, decode with drafts, prefill slices, head rows)
 *   engine_sample.c  what the root does with a step: its bookkeeping as it launches
 *                    (advance), then with its sampled tokens (consume): emission, draft
 *                    verification, stop conditions, failed requests, the result callback
 *   engine_report.c  progress lines, the report, results and their JSONL
 */
#ifndef GDP_ENGINE_INTERNAL_H
#define GDP_ENGINE_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "gdp/engine.h"
#include "backend.h"
#include "phase.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#endif

#define GDP_ENGINE_MAGIC 0x67646567u /* "gdeg" */
#define MAX_DRAFTS 16

/* The step frame the root broadcasts (host memory, int32 words): a header, then sections
 *   swap-outs [n_slots][4] {slot, buffer, draft S, kept}, swap-ins [n_slots][2] {buffer, slot},
 *   tokens [max_rows] (every real row: decode rows in order, then the prefill slices),
 *   head [max_head][HEAD_WORDS] {row of x, gdp_sample_row as 6 words}: the rows to sample.
 * A row token t <= -2 is a reference: the token the previous device step sampled in its head
 * row -2 - t, which the root composes before it has read it (gdp_model_embed_device resolves
 * it on the device). F_WAIT_NOW: every rank finishes this step (waits, agrees, the root
 * consumes) before the next frame; 0: the step stays pending while the next one is composed
 * and launched. FRAME_SYNC: no step; finish the pending one now. */
enum { F_KIND = 0, F_STEP, F_SWAP_OUT, F_SWAP_IN, F_DECODE, F_S, F_PREFILL, F_TOKENS, F_RELEASE_ONLY, F_HEAD,
       F_WAIT_NOW, F_HEADER };
enum { FRAME_STEP = 1, FRAME_STOP, FRAME_ERROR, FRAME_SYNC };
#define SWAP_OUT_WORDS 4
#define SWAP_IN_WORDS 2
#define HEAD_WORDS 7

/* RQ_ENDING: the step in flight draws the request's last token (max_new_tokens): its slot is
 * released already, and it is done once that token is consumed. */
typedef enum rq_state { RQ_FUTURE = 0, RQ_QUEUED, RQ_PREFILL, RQ_DECODE, RQ_SWAPPED, RQ_ENDING, RQ_DONE } rq_state;

/* One request on the root. */
typedef struct rq {
    const gdp_request_spec *spec;
    rq_state state;
    int32_t *tokens;          /* prompt + generated, capacity prompt + max_new + S_max  */
    int32_t  n_tokens;
    int32_t  n_fed;           /* tokens whose effect the slot (or swap buffer) holds    */
    int32_t  n_gen;
    int32_t  n_ahead;         /* tokens launched for sampling and not consumed yet        */
    int32_t  pend_head;       /* the head row of its last launched draw (a reference)    */
    int64_t  pend_step;       /* ... in this device step (engine dev_steps)              */
    float   *margin, *scale;  /* [max_new] top-2 margin and max |logit| per token        */
    double   last_token_s;
    int32_t  slot, swap_buf;
    int32_t  draft_S, draft_keep; /* a pending accept of the last draft step (keep < S) */
    int64_t  order;           /* FIFO position (admission or preemption)                */
    double   wait_since;      /* when it last started waiting for a slot (queued, swapped) */
    int32_t  run_steps;       /* decode steps since (re)admission                       */
    int32_t  preemptions, drafts_proposed, drafts_accepted;
    int32_t  finish_reason;   /* gdp_finish_reason once done                            */
    char     error[192];      /* GDP_FINISH_ERROR: why                                  */
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
    int      stream_results; /* call the config's on_result as requests finish          */
} run;

/* What the root composed for the step besides the frame (arrays sized at engine init). */
typedef struct step_plan {
    gdp_step_desc        desc;
    int32_t             *dec_req;    /* [n_slots] request of each decode entry              */
    int32_t             *n_drafts;   /* [n_slots] real drafts of each decode request        */
    int32_t             *drafts;     /* [n_slots, MAX_DRAFTS] the drafts                     */
    int32_t             *dec_slots;  /* [n_slots]                                           */
    int32_t             *releases;   /* [n_slots]                                           */
    gdp_draft_accept    *accepts;    /* [n_slots]                                           */
    int32_t             *freed_bufs; /* [n_slots] swap ids free again after this step      */
    int32_t              n_freed_bufs;
    int32_t             *pre_req;    /* [max_prefill] request of each prefill entry         */
    int32_t             *pre_head;   /* [max_prefill] its head row (completes its prompt), -1 */
    int32_t              padded_rows;/* the bucket's rows (advance sets it)                 */
    int                  need_sync;  /* compose ahead refused: finish the pending step first */
    int32_t             *logit_rows; /* [max_head] check mode: rows of x whose logits are kept */
    int32_t              n_logit;
    int                  logits_done;/* computed into e->logits                            */
    gdp_prefill_request *prefill;    /* [max_prefill]                                       */
    double               idle_s;     /* time the root slept waiting for arrivals            */
} step_plan;

/* A captured step shape: two graphs of the same launches, one without phase marks (most
 * steps: an event node between phases costs device time) and one with them, replayed for
 * every PHASE_SAMPLE-th launch of the shape (engine.c), whose marks split the device time by
 * phase. Each is captured at init (graphs_at_init) or on its first use. */
typedef struct graph_entry {
    int32_t        captured;
    int64_t        replays;
    int64_t        launches; /* of either graph: picks the marked one (engine.c)          */
    gdp_phase_list marks;    /* the marked graph's marks (re-recorded at its every replay) */
#ifdef GDP_HAVE_CUDA
    cudaGraphExec_t exec, exec_marked;
#endif
} graph_entry;

/* The step buffer every rank fills from the frame and sends to the device in one copy:
 * the row tokens of the embedding gather and the head's rows and sampling parameters.
 * Offsets in bytes into step_host / step_dev. */
typedef struct step_layout {
    size_t tokens, head_rows, params, bytes;
} step_layout;

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
    int32_t          *bucket_head;  /* [n_buckets] rows the head samples in the bucket     */
    int32_t          *bucket_seen;
    graph_entry      *graphs;
    int               graphs_live;  /* graphs really captured (CUDA with NCCL or tp = 1)  */
    int32_t           graphs_at_init; /* buckets captured at init (capture_all), and how long */
    double            graphs_init_s;
    int64_t           ws_grows_warm;   /* gdp_model_workspace_grows after the warm-up step: no step may
                                          change it (captured graphs hold the workspaces' addresses) */
    /* step buffers */
    int32_t          *frame;
    size_t            frame_words;
    int64_t           max_rows;     /* rows of the largest bucket                         */
    int32_t           max_head;     /* sampled rows of the largest bucket                 */
    void             *x;            /* [max_rows, D] backend                              */
    step_layout       lay;
    /* Two of each host buffer, step parity k = dev_steps & 1, so step n + 1 is filled while
     * step n's copies may be queued; the device buffers are one (stream order) and keep
     * their addresses for the graphs. */
    char             *step_host[2]; /* pinned on CUDA                                     */
    char             *step_dev;     /* backend memory                                     */
    gdp_sample_out   *out_dev;      /* [max_head] backend: the last device step's draws   */
    gdp_sample_out   *out_host[2];  /* [max_head] pinned on CUDA: copies of out_dev (root) */
    void             *ev_copied[2]; /* CUDA: step_host[k]'s H2D copy done                 */
    void             *ev_start[2], *ev_done[2]; /* CUDA: around step k (done: after its D2H) */
    int64_t           dev_steps;    /* device steps launched in this run                  */
    int32_t           prev_head;    /* head rows of the last device step (records in out_dev) */
    float            *logits;       /* [max_head, vocab] root, check mode only             */
    int32_t          *logit_rows;
    /* swap pool (every rank) */
    char            **swap_bufs;
    unsigned char    *swap_dev;     /* per buffer: 1 device memory, 0 host memory          */
    int32_t           n_swap_bufs;
    int32_t           swap_host_fallbacks; /* buffers in host memory after cudaMalloc failed */
    size_t            swap_bytes;   /* one request's state on this rank                   */
    int32_t           swap_live, swap_live_peak;
    /* measured phases: eager marks; device totals of every step and of sampled steps */
    gdp_phase_list    eager_marks;
    double            dev_all_s, dev_sampled_s, dev_phase_s[GDP_MARK_NUM];
    double            floor_bytes_per_token, floor_bytes_per_state, floor_flops_per_token;
    /* the step trace (root, GDP_ENGINE_TRACE=path): one CSV line a step, host and device times */
    FILE             *trace;
    void             *trace_ev;     /* CUDA: recorded at the run's start, the device clock's zero */
    double            trace_zero_s; /* the host time (since t0) at which trace_ev completed */
    /* results */
    run               main;
    int               have_run;
    gdp_engine_report report;
    uint32_t          magic_end;
};

static inline double eng_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static inline double eng_elapsed(double t0) { return eng_now() - t0; }

/* Frame sections. */
static inline int32_t *frame_swap_out(const struct gdp_engine *e) { return e->frame + F_HEADER; }
static inline int32_t *frame_swap_in(const struct gdp_engine *e) {
    return frame_swap_out(e) + SWAP_OUT_WORDS * e->cfg.n_slots;
}
static inline int32_t *frame_tokens(const struct gdp_engine *e) {
    return frame_swap_in(e) + SWAP_IN_WORDS * e->cfg.n_slots;
}
static inline int32_t *frame_head(const struct gdp_engine *e) { return frame_tokens(e) + e->max_rows; }

/* engine.c */
gdp_status_t eng_check(const struct gdp_engine *e, const char *op);

/* engine_sched.c */
gdp_status_t eng_make_buckets(struct gdp_engine *e);
int32_t      eng_bucket_for(const struct gdp_engine *e, int32_t S, int32_t n_decode, int32_t prefill_tokens,
                            int32_t n_prefill);
gdp_status_t eng_validate_workload(const struct gdp_engine *e, const gdp_workload *wl, int64_t *total_new);
gdp_status_t eng_run_init(struct gdp_engine *e, run *r, const gdp_workload *wl, int32_t keep_logits,
                          int first_logits);
void         eng_run_free(run *r);
step_plan   *eng_step_plan_alloc(const struct gdp_engine *e);
void         eng_step_plan_free(step_plan *sp);
gdp_status_t eng_compose(struct gdp_engine *e, run *r, step_plan *sp, double t0, int64_t step_no, bool ahead);

/* engine_sample.c */
void         eng_advance(struct gdp_engine *e, run *r, step_plan *sp, const gdp_step_metadata *m);
gdp_status_t eng_consume(struct gdp_engine *e, run *r, step_plan *sp, const gdp_sample_out *out, double t0);
gdp_status_t eng_keep_logits(struct gdp_engine *e, step_plan *sp);
int32_t      eng_argmax(const float *l, int64_t V, float *margin, float *scale);
void         eng_fail_request(struct gdp_engine *e, run *r, int32_t index, double t, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void         eng_result(const struct gdp_engine *e, const run *r, int32_t index, gdp_request_result *out);

/* engine_report.c */
void         eng_progress_line(const struct gdp_engine *e, const run *r, double t, int64_t steps, bool last);
void         eng_finish_report(struct gdp_engine *e, const run *r, double wall);
size_t       eng_peak_rss_bytes(void);

#endif /* GDP_ENGINE_INTERNAL_H */
