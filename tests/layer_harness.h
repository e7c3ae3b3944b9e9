/*
 * layer_harness.h: what the multi-rank layer tests (test_layer_tp.c, test_layer_cp.c) share:
 * the stack sizes and bars they both use, the job's globals (rank, backend, contexts), device
 * memory helpers, the scheduled-request table and its step description, the seeded token rows,
 * the per-(request, position) record of each layer's delta, and the comparison that applies
 * the CPU bar (max|a - b| <= bar max|b|) or the GPU bar (relative RMS) of gdp-math.md 8.1.
 * Each test keeps its own stacks (a TP shard or a CP shard), scenarios and messages.
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
/* The ssm and conv state of a slot in a cache (this rank's share), as doubles; the count. */
int64_t lh_local_state(bool gpu, gdp_cache_t cache, int32_t slot, double *out);
/* Frees a stack's layers, cache and plan, checking each call. */
void lh_free_stack(gdp_layer_t layers[LAYERS], gdp_cache_t cache, gdp_plan_t plan);

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
/* Checks every stack built the same step (bucket, metadata bytes, slots; names[k]: stack k's
 * name), then gives the new requests their slots and marks released ones dead. */
void lh_agree_on_step(const tstep *t, const gdp_step_metadata *const ms[MAX_STACKS], int n_stacks,
                      const char *const names[MAX_STACKS], int32_t step_no, request *reqs);
/* Moves the positions of the step's requests on (decodes by S, remembering the draft base). */
void lh_advance_positions(const tstep *t, int32_t S, request *reqs);

/* Token rows ~ N(0, 0.05^2): the residual stream is then of the order of a layer's
 * output (~0.03 here), so comparing each layer's delta x_out - x_in measures the layer,
 * not the fp32 rounding of a much larger residual (1 ulp of |x| ~ 3 is 2.4e-7, i.e. 1e-5
 * of these deltas). The pre-norm makes the layer itself independent of the scale. */
#define TOKEN_SCALE 0.05
void token_row(int32_t seed, int32_t pos, float *row);

/* delta of layer l at (request, position), per stack: [stack][req][pos][layer][D] */
extern double g_rec[MAX_STACKS][LH_MAX_REQ][MAXPOS][LAYERS][D_MODEL];
extern bool g_have[LH_MAX_REQ][MAXPOS];
/* Records each stack's layer deltas of a step's request rows (x_k = xs[k], outs[k][l] = x after
 * layer l); returns how many values of padding rows (tag_req < 0) changed. */
int64_t lh_record_deltas(int n_stacks, int64_t T, float *const xs[MAX_STACKS], float *outs[MAX_STACKS][LAYERS],
                         const int32_t *tag_req, const int32_t *tag_pos);

/* ---- comparisons ------------------------------------------------------------------------ */
extern double *g_a, *g_b; /* comparison scratch */
#define SCRATCH (LAYERS * D_MODEL * MAXPOS * 4)

/* The bar of the backend under test: on the CPU max|a - b| <= cpu_bar * max|b|; on the GPU
 * ||a - b|| <= gpu_bar * ||b|| (or <= 1e-6 when b is all zero). Raises *worst to the ratio
 * when larger (or NaN); returns the ratio, the bar applied in *bar. */
double lh_check_close(const char *what, const double *a, const double *b, int64_t n, double cpu_bar,
                      double gpu_bar, double *worst, double *bar);
/* Fills g_a, g_b with the recorded deltas of (ra, positions pa..) and (rb, pb..) in stack 0;
 * the count. */
int64_t lh_gather_positions(const char *what, int32_t ra, int32_t pa, int32_t rb, int32_t pb, int32_t n);
/* Fills g_a, g_b with the recorded deltas of every request row of this step in stacks sa and
 * sb; the count (0 when they overflow the scratch, a failed check). */
int64_t lh_gather_step_rows(const char *what, int sa, int sb, const int32_t *tag_req, const int32_t *tag_pos,
                            int64_t T);

#endif /* GDP_TEST_LAYER_HARNESS_H */
