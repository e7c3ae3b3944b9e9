/*
 * layer_harness.h: what the multi-rank layer tests (test_layer_tp.c, test_layer_cp.c) share:
 * the stack sizes and bars they both use, the job's globals (rank, backend, contexts), options
 * and skip, device memory helpers; a stack of layers with its cache and plan (which rows of x
 * and which part of the state this rank holds), the scheduled-request table, the step driver
 * (prepare on every stack, seeded token rows, forward, the per-(request, position) record of
 * each layer's delta, outputs and states vs the reference), the comparison that applies the CPU
 * bar (max|a - b| <= bar max|b|) or the GPU bar (relative RMS) of gdp-math.md 8.1, the two
 * scenarios both tests run step for step (chunked prefill and decode, prefix restore), and the
 * fixture of the refused-forward checks. Each test keeps how its stacks are sharded (TP or CP),
 * its other scenarios and its messages.
 */
#ifndef GDP_TEST_LAYER_HARNESS_H
#define GDP_TEST_LAYER_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gdp/cache.h"
#include "gdp/comm.h"
#include "gdp/gdp.h"
#include "gdp/layer.h"
#include "gdp/plan.h"
#include "test_common.h"
#include "test_gpu.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define LAYERS 2
#define D_MODEL 32
#define N_SLOTS 8
#define N_SNAPSHOTS 2
#define MAX_DRAFT 3
#define MAXPOS 256
#define MAX_STACKS 3  /* the stack under test, its TP = 1 reference, and (--backend cuda) a CPU one */
#define LH_MAX_REQ 11 /* the most requests a test schedules (its NREQ)                            */

/* CPU backend: max|a - b| <= bar * max|b| (gdp-math.md 8.1, CPU). */
#define BAR_RECOMPUTE 1e-4 /* decode vs recomputing the sequence */
/* CUDA backend: relative RMS (gdp-math.md 8.1, GPU). */
#define GPU_BAR_OUT 2e-2   /* layer outputs */
#define GPU_BAR_STATE 8e-3 /* ssm and conv states */

/* ---- the job ---------------------------------------------------------------------------- */
extern int g_rank, g_size;
extern bool g_sp;            /* --sp: sequence parallel                      */
extern bool g_cuda;          /* --backend cuda                               */
extern gdp_ctx_t g_ctx;      /* the backend under test                       */
extern gdp_ctx_t g_cpu_ctx;  /* --backend cuda: the CPU reference's backend  */
extern gdp_comm_t lh_fatal_comm; /* the job-wide comm GDP_FATAL ends (NULL before it exists) */

/* --backend cuda: whether this rank can run on a GPU, and the skip every rank agrees on:
 * test_gpu_usable and test_gpu_all_ranks_usable (test_gpu.h). */
/* g_ctx on the backend under test (CUDA: device_comm's GPU, a non-blocking stream, and the
 * CPU g_cpu_ctx); lh_ctx_free frees them. */
void lh_ctx_init(gdp_comm_t device_comm);
void lh_ctx_free(void);
/* MPI_Init, g_rank and g_size. */
void lh_mpi_init(int *argc, char ***argv);
/* Takes argv[*i] (and its value, moving *i on) when it is an option both tests have: --sp,
 * --backend cpu|cuda; false otherwise. */
bool lh_common_arg(int argc, char **argv, int *i);
/* --backend cuda: whether to skip (MPI finalized; the caller returns TEST_SKIP) because some
 * rank is not usable (usable: 1, or 0 and the reason in why). Every rank skips, or none: a
 * rank alone would leave the others in a collective. */
bool lh_skip_without_gpu(const char *name, int (*usable)(char *why, size_t n));
/* Sums the failures over the ranks, prints the summary, finalizes MPI; the exit code. */
int lh_finish(const char *name);

/* ---- device memory of the test (CUDA runtime calls end the job when they fail) ---------- */
#ifdef GDP_HAVE_CUDA
extern void *g_stream; /* --backend cuda: the ctx's stream (a non-blocking cudaStream_t) */
#define LH_CUDA_OK(call)                                                                             \
    do {                                                                                             \
        cudaError_t cuda_err_ = (call);                                                              \
        if (cuda_err_ != cudaSuccess)                                                                \
            GDP_FATAL(lh_fatal_comm, "%s failed: %s", #call, cudaGetErrorString(cuda_err_));        \
    } while (0)
#endif
void *dev_alloc(size_t bytes);
void dev_free(void *p);
/* Host <-> device copies on the ctx's stream (g_stream), ordered with the layers' work;
 * both return once the copy has completed. */
void dev_upload(void *dst, const void *src, size_t bytes);
void dev_download(void *dst, const void *src, size_t bytes);

/* n floats at base + offset of a buffer (device memory when gpu), as doubles. */
void lh_read_floats(bool gpu, const void *base, int64_t offset, int64_t n, double *out);

/* ---- the scheduled requests ----------------------------------------------------------- */
typedef struct request {
    int32_t seed;       /* token content: rows are seeded by (seed, position) */
    int32_t pos;        /* next position                                       */
    int32_t draft_base; /* position before the last decode step                */
    int32_t slot;       /* slot (the same in every stack, checked)             */
    int32_t live;
} request;

typedef struct tstep {
    int32_t S, n_dec, dec[4];
    int32_t n_pre, pre[4], tokens[4], flags[4], restore[4], save[4], save_off[4];
    int32_t n_rel, rel[8];
    int32_t n_acc, acc[4], acc_n[4];
    int32_t bucket; /* 0 = GDP_BUCKET_AUTO, b + 1 = bucket b */
} tstep;

/* The step's desc from the request table reqs (accepts move positions back first). */
gdp_step_desc lh_make_desc(const tstep *t, request *reqs, int32_t *dec_slots, int32_t *rel_slots,
                           gdp_prefill_request *pre, gdp_draft_accept *acc);

/* Token rows ~ N(0, 0.05^2): the residual stream is then of the order of a layer's
 * output (~0.03 here), so comparing each layer's delta x_out - x_in measures the layer,
 * not the fp32 rounding of a much larger residual (1 ulp of |x| ~ 3 is 2.4e-7, i.e. 1e-5
 * of these deltas). The pre-norm makes the layer itself independent of the scale. */
#define TOKEN_SCALE 0.05
void token_row(int32_t seed, int32_t pos, float *row);

/* delta of layer l at (request, position), per stack: [stack][req][pos][layer][D] */
extern double g_rec[MAX_STACKS][LH_MAX_REQ][MAXPOS][LAYERS][D_MODEL];
extern bool g_have[LH_MAX_REQ][MAXPOS];

/* ---- a stack of layers with its cache and plan ---------------------------------------------- */
#define LH_MAX_CONV_RANGES 16 /* conv sections of a shard (2M + 1) */
typedef struct lh_stack {
    const char   *name;
    gdp_ctx_t     ctx;
    bool          gpu;       /* its buffers (x, states) are device memory                        */
    gdp_comm_t    plan_comm; /* the step plan's comm; NULL: a single-rank stack builds its own step */
    gdp_tp_mode_t mode;
    /* This rank's rows of each step's padded x: block row_block of row_blocks equal blocks;
     * row_owner: the outputs are assembled from this rank's copy of them (one copy per row). */
    int32_t row_blocks, row_block;
    bool    row_owner;
    /* The part of the whole layer's state the stack holds, in its local order: the ssm heads
     * [head_begin, + num_heads) and the conv channels [conv_begin[i], + conv_rows[i]). */
    int64_t head_begin, num_heads;
    int32_t n_conv_ranges;
    int64_t conv_begin[LH_MAX_CONV_RANGES], conv_rows[LH_MAX_CONV_RANGES];
    gdp_layer_t layers[LAYERS];
    gdp_cache_t cache;
    gdp_plan_t  plan;
} lh_stack;

/* Clears s and sets what every stack has; the test then loads its layers, sets the rows and
 * the state it holds, and calls lh_stack_finish with its cache config. */
void lh_stack_begin(lh_stack *s, const char *name, gdp_ctx_t ctx, gdp_comm_t plan_comm, gdp_tp_mode_t mode);
/* The cache (cc with the harness's drafts and snapshots) and the plan (the test's buckets;
 * the debug hash check when debug_check). */
void lh_stack_finish(lh_stack *s, gdp_cache_config *cc, int32_t num_householder, const gdp_step_bucket *buckets,
                     int32_t n_buckets, bool debug_check);
/* Frees a stack's layers, cache and plan, checking each call. */
void lh_stack_free(lh_stack *s);
/* Broadcast over plan_comm (rank 0 decides), build, check consistency, apply. */
const gdp_step_metadata *lh_stack_prepare(lh_stack *s, const gdp_step_desc *d);
/* This rank's rows of a step of T padded rows. */
void lh_local_rows(const lh_stack *s, int64_t T, int64_t *first, int64_t *count);
/* Runs every layer on this rank's rows of x_full [T, D] (every rank holds all rows); outs[l] =
 * the whole x after layer l, assembled over the job from each row's owner when the stack holds
 * only some rows (a sum of exact copies and zeros). */
void lh_stack_forward(lh_stack *s, const gdp_step_metadata *m, const float *x_full, float *outs[LAYERS]);
/* The ssm and conv state of a slot in a stack's cache (this rank's share), as doubles; the count. */
int64_t lh_local_state(const lh_stack *s, int32_t slot, double *out);
/* The reference's state of a slot restricted to what stack s holds, in s's local order. */
int64_t lh_ref_state_as_local(const lh_stack *ref, const lh_stack *s, int32_t slot, double *out);

/* ---- the job's stacks, requests and step driver ----------------------------------------------- */
/* Worst ratio per kind of comparison (max|a-b|/max|b| on the CPU, relative RMS on the GPU). */
enum { K_OUT, K_SCENARIO, K_RECOMPUTE, K_STATE, K_LOGITS, K_CPU_OUT, K_CPU_STATE, K_KINDS };
typedef struct lh_job {
    /* [0] the stack under test, [1] its single-rank reference, [2] (--backend cuda) the
     * reference on the CPU backend */
    lh_stack *stacks[MAX_STACKS];
    int       n_stacks;
    request  *reqs;
    int32_t   n_reqs;
    char      vs[48];           /* stack 0 vs stack 1 in the step lines, e.g. "tp 2 vs tp 1"        */
    double    bar;              /* CPU bar of stack 0 vs 1, chunked prefill, restore, drafts        */
    bool      print_every_rank; /* the scenarios' ratios: every rank prints its own (else rank 0) */
    int32_t   step_no;
    double    worst[K_KINDS];
} lh_job;
extern lh_job g_job;

/* Prepares the step on every stack; checks every stack built the same bucket, metadata bytes
 * and slots, then gives the new requests their slots and marks released ones dead. */
void lh_prepare_all(const tstep *t, const gdp_step_desc *d, const gdp_step_metadata *ms[MAX_STACKS]);
/* Rows of x of each request token of the step: tag_req/tag_pos (-1: padding). */
void lh_tag_rows(const tstep *t, const gdp_step_metadata *m, int32_t *tag_req, int32_t *tag_pos);
/* Runs the prepared step on every stack (xs[k]: stack k's input rows); records each layer's
 * delta per (request, position); padding rows must come out exactly as they went in; compares
 * stack 0 with its reference (and on the GPU the GPU reference with the CPU one). Fills
 * finals[k] with each stack's last layer output when finals != NULL. */
void lh_forward_all(const gdp_step_metadata *ms[MAX_STACKS], float *xs[MAX_STACKS], const int32_t *tag_req,
                    const int32_t *tag_pos, float *finals[MAX_STACKS]);
/* Moves the positions on (decodes by S, remembering the draft base) and compares every live
 * request's states: stack 0's share vs the reference's (and GPU vs CPU reference). */
void lh_finish_step(const tstep *t, int32_t S);
/* One scheduled step with seeded token rows, the same x on every stack, checked as above. */
void lh_run_step(const tstep *t);
/* Frees the job's stacks and the comparison scratch; worst = the largest ratios over the ranks. */
void lh_job_end(double worst[K_KINDS]);

/* ---- comparisons ------------------------------------------------------------------------ */
extern double *g_a, *g_b; /* comparison scratch */
#define SCRATCH (LAYERS * D_MODEL * MAXPOS * 4)

/* The bar of the backend under test: on the CPU max|a - b| <= cpu_bar * max|b|; on the GPU
 * ||a - b|| <= gpu_bar * ||b|| (or <= 1e-6 when b is all zero). Raises g_job.worst[kind]; the
 * scenarios' comparisons (K_SCENARIO, K_RECOMPUTE) print their ratio. */
void check_close(const char *what, const double *a, const double *b, int64_t n, double cpu_bar, double gpu_bar,
                 int kind);
/* Compares recorded deltas of (ra, positions pa..) with (rb, pb..), both in stack 0. */
void compare_positions(const char *what, int32_t ra, int32_t pa, int32_t rb, int32_t pb, int32_t n, double bar,
                       int kind);
/* The states of two requests in stack 0 (this rank's share). */
void compare_states(const char *what, int32_t qa, int32_t qb, double bar, int kind);

/* ---- bad input: an error on every rank, nothing modified ------------------------------------ */
/* A step in flight (request slot decodes one token on stack s), this rank's x of its rows plus
 * one (count + 1 rows of i % 7) where the backend reads it, and copies of x and of the slot's
 * state, so each refusal can check that nothing changed. */
typedef struct lh_refusal {
    lh_stack                *s;
    int32_t                  slot, dslot[1];
    gdp_step_desc            d;
    const gdp_step_metadata *m;     /* the step, prepared                         */
    int64_t                  count; /* this rank's rows of it                     */
    size_t                   x_bytes;
    float                   *x, *x_copy;
    void                    *xd;    /* x where the stack's backend reads it        */
    int64_t                  ns;    /* the slot's state, saved in g_a              */
} lh_refusal;
void lh_refusal_begin(lh_refusal *r, lh_stack *s, int32_t slot);
/* Checks x and the slot's state are as they were ("<what>: a refused forward modified ..."). */
void lh_refusal_unchanged(lh_refusal *r, const char *what);
/* layer 0 of stack s on `rows` rows at data must fail with `status`, the message naming want
 * (NULL: not checked). */
void lh_check_refused(const lh_stack *s, gdp_cache_t cache, const gdp_step_metadata *m, void *data, int64_t rows,
                      gdp_status_t status, const char *want);
/* x of the wrong shape (one row too many), then metadata built but not applied: both refused,
 * nothing modified. */
void lh_refuse_shape_and_unapplied(lh_refusal *r);
void lh_refusal_end(lh_refusal *r);

/* ---- the scenarios both tests run, step for step ---------------------------------------------- */
/* Their requests; a test's own requests follow LH_SCENARIO_REQS. */
enum { A, A2, B, B2, C, C2, DD, D2, LH_SCENARIO_REQS };
#define NEW GDP_PREFILL_NEW
#define SAVE GDP_PREFILL_SAVE
#define RESTORE GDP_PREFILL_RESTORE
/* Steps 1-3: A prefilled in one slice vs A2 in chunks 64 + 64 + 43, B in chunks 3 + 2 (the
 * last shorter than the conv width) vs B2 in one; then decode vs recompute (BAR_RECOMPUTE). */
void lh_scenario_chunked_and_decode(void);
/* Steps 4-5: C saves a snapshot at token 128 inside its slice, D at its slice's end; C2 and
 * D2 restore them and continue: equal to the uninterrupted runs. */
void lh_scenario_prefix(void);

#endif /* GDP_TEST_LAYER_HARNESS_H */
