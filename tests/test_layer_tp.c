/*
 * test_layer_tp.c: the tensor-parallel GDP layer stack, under mpirun, on the CPU backend
 * (default) or the CUDA backend (--backend cuda).
 *
 * Rank 0 writes one seeded global checkpoint (2 layers, fp32). Every rank then runs two
 * stacks over the same scheduled steps: the TP stack (its shard of every layer, tp = the
 * number of ranks, all-reduce or, with --sp, sequence parallel) and a TP = 1 reference of
 * the whole layer, each with its own state cache and step plan. Each step's token rows are
 * seeded by (request content, position), so runs that schedule a sequence differently
 * feed the same tokens. Checks (gdp-math.md 8.1, CPU bars):
 *   - every step: each layer's output (its residual delta) of the TP stack vs the TP = 1
 *     stack, max|a - b| <= 1e-5 max|b|; this rank's heads of every live slot's ssm state
 *     and its channels of the conv state vs the reference's, same bar; padding rows come
 *     out exactly as they went in; the step's metadata is identical on every rank (the
 *     plan's debug hash check, and gdp_plan_check_consistent); new slots agree;
 *   - a prompt prefilled in chunks (64 + 64 + 43, and 3 + 2 with a last chunk shorter
 *     than the conv width) equals one prefill: 1e-5;
 *   - decode after prefill equals recomputing the whole sequence: outputs and states 1e-4;
 *   - restoring a prefix snapshot (saved inside a slice at token 128, and at a slice's
 *     end) and continuing equals the uninterrupted run: outputs and states 1e-5;
 *   - speculative decoding: keeping n_accepted of S = 3 draft tokens (1, 2 and 3) and
 *     continuing equals running only those tokens: 1e-5;
 *   - bad input: x of the wrong shape, metadata not applied to the cache, a padded token
 *     count that sequence parallel cannot split, weights of another rank: an error on
 *     every rank naming the numbers, x and the cache unchanged.
 * With --backend cuda (labels gpu;mpi) the same steps run on the GPU: the TP stack and the
 * TP = 1 reference on the CUDA backend (bf16 activations and weights, fp32 residual stream
 * and states), plus a third stack, TP = 1 on the CPU backend, on the same checkpoint. The
 * comm is MPI with device buffers (ranks may share one GPU: it stages through the host) or,
 * with --comm nccl, NCCL (one GPU per rank). Every comparison above then uses the GPU bars
 * of gdp-math.md 8.1: relative RMS ||a - b|| / ||b|| <= 2e-2 on layer outputs and <= 8e-3
 * on states (absolute 1e-6 where the reference is all zero); and every step also compares
 * the GPU TP = 1 stack with the CPU TP = 1 stack under the same bars. Padding rows must
 * still come out exactly as they went in (fp32 residual, zero mixer output), and the step's
 * metadata must be byte-identical across ranks and stacks. Without a GPU (or NCCL, when
 * asked for) on any rank, every rank exits 77 (skipped).
 * Failure counts are summed over the ranks, so every rank exits the same way.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gdp/cache.h"
#include "gdp/checkpoint.h"
#include "gdp/comm.h"
#include "gdp/layer.h"
#include "gdp/plan.h"
#include "layer_harness.h"
#include "test_common.h"

#define NREQ 8
_Static_assert(NREQ <= LH_MAX_REQ, "the harness records LH_MAX_REQ requests");

/* CPU backend: max|a - b| <= bar * max|b| (gdp-math.md 8.1, CPU); BAR_RECOMPUTE and the GPU
 * bars (relative RMS, whatever the comparison) are the harness's. */
#define BAR_TP 1e-5       /* TP sizes, chunked prefill, prefix restore, draft rollback */

static gdp_comm_t g_comm;
static bool g_nccl = false; /* --comm nccl    */

static const gdp_step_bucket k_buckets[] = {{4, 4, 256}, {4, 4, 512}, {1, 1, 513}};
#define N_BUCKETS 3
#define ODD_BUCKET 2 /* 513 rows: never the smallest fit; sequence parallel cannot split them */
#define ODD_ROWS 513

/* ---- a stack of layers with its cache and plan --------------------------------------- */
typedef struct stack {
    const char   *name;
    gdp_ctx_t     ctx;
    bool          gpu;  /* its buffers (x, states) are device memory */
    gdp_comm_t    comm; /* NULL: the TP = 1 reference */
    gdp_tp_mode_t mode;
    int32_t       tp_rank, tp_size;
    gdp_tp_shard  shard;
    gdp_layer_t   layers[LAYERS];
    gdp_cache_t   cache;
    gdp_plan_t    plan;
} stack;

static void stack_init(stack *s, const char *name, const char *path, gdp_ctx_t ctx, gdp_comm_t comm,
                       gdp_tp_mode_t mode) {
    memset(s, 0, sizeof *s);
    s->name = name;
    s->ctx = ctx;
    gdp_backend_t backend;
    GDP_FATAL_IF_ERROR(g_comm, gdp_ctx_get_backend(ctx, &backend));
    s->gpu = backend == GDP_BACKEND_CUDA;
    s->comm = comm;
    s->mode = mode;
    s->tp_rank = comm ? g_rank : 0;
    s->tp_size = comm ? g_size : 1;
    gdp_checkpoint_t ck = NULL;
    GDP_FATAL_IF_ERROR(g_comm, gdp_checkpoint_open(&ck, path));
    for (int32_t l = 0; l < LAYERS; l++) {
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        GDP_FATAL_IF_ERROR(g_comm, gdp_checkpoint_load_layer_shard(ck, &w, l, s->tp_rank, s->tp_size));
        GDP_FATAL_IF_ERROR(g_comm, gdp_layer_init(&s->layers[l], ctx, comm, &w, mode));
        s->shard = w.shard;
        gdp_layer_weights_free(&w);
    }
    gdp_checkpoint_free(ck);
    gdp_cache_config cc;
    GDP_FATAL_IF_ERROR(g_comm, gdp_cache_config_init(&cc, &s->shard, N_SLOTS));
    cc.max_draft_tokens = MAX_DRAFT;
    cc.n_snapshots = N_SNAPSHOTS;
    GDP_FATAL_IF_ERROR(g_comm, gdp_cache_init(&s->cache, ctx, &cc));
    gdp_plan_config pc = {.num_householder = s->shard.config.num_householder, .n_slots = N_SLOTS,
                          .max_decode_tokens = MAX_DRAFT, .n_buckets = N_BUCKETS, .buckets = k_buckets,
                          .debug_check = comm != NULL};
    GDP_FATAL_IF_ERROR(g_comm, gdp_plan_init(&s->plan, ctx, &pc));
}

static void stack_free(stack *s) { lh_free_stack(s->layers, s->cache, s->plan); }

/* Broadcast (rank 0 decides), build, check consistency, apply. */
static const gdp_step_metadata *stack_prepare(stack *s, const gdp_step_desc *d) {
    const gdp_step_metadata *m = NULL;
    GDP_FATAL_IF_ERROR(g_comm, gdp_plan_bcast(s->plan, s->comm, 0, g_rank == 0 || !s->comm ? d : NULL));
    GDP_FATAL_IF_ERROR(g_comm, gdp_plan_build(s->plan, s->cache, s->comm, &m));
    CHECK_OK(gdp_plan_check_consistent(m, s->comm));
    GDP_FATAL_IF_ERROR(g_comm, gdp_cache_apply_step(s->cache, m));
    return m;
}

/* This rank's rows of x under the stack's mode. */
static void local_rows(const stack *s, int64_t T, int64_t *first, int64_t *count) {
    if (s->comm != NULL && s->mode == GDP_TP_MODE_SEQUENCE_PARALLEL) {
        *count = T / s->tp_size;
        *first = s->tp_rank * *count;
    } else {
        *first = 0;
        *count = T;
    }
}

/* Runs every layer on x_full [T, D] (every rank holds all rows); outs[l] = the whole x
 * after layer l (gathered over the ranks with sequence parallel). */
static void stack_forward(stack *s, const gdp_step_metadata *m, const float *x_full, float *outs[LAYERS]) {
    const int64_t T = m->padded_token_count;
    int64_t first, count;
    local_rows(s, T, &first, &count);
    const size_t bytes = sizeof(float) * (size_t)(count * D_MODEL);
    float *x = malloc(bytes);
    memcpy(x, x_full + first * D_MODEL, bytes);
    void *xd = x; /* x where the stack's backend reads it */
    if (s->gpu) {
        xd = dev_alloc(bytes);
        dev_upload(xd, x, bytes);
    }
    for (int32_t l = 0; l < LAYERS; l++) {
        gdp_tensor xt;
        gdp_tensor_init(&xt, xd, GDP_DTYPE_FP32, 2, (const int64_t[]){count, D_MODEL});
        GDP_FATAL_IF_ERROR(g_comm, gdp_layer_forward(s->layers[l], s->cache, m, &xt));
        if (s->gpu)
            dev_download(x, xd, bytes);
        if (count == T)
            memcpy(outs[l], x, sizeof(float) * (size_t)(T * D_MODEL));
        else
            MPI_Allgather(x, (int)(count * D_MODEL), MPI_FLOAT, outs[l], (int)(count * D_MODEL), MPI_FLOAT,
                          MPI_COMM_WORLD);
    }
    if (s->gpu)
        dev_free(xd);
    free(x);
}

/* ---- the scheduled requests (request, tstep, token_row, g_rec: the harness's) ------------ */
static request g_req[NREQ];

/* Worst ratio per kind of comparison (max|a-b|/max|b| on the CPU, relative RMS on the GPU). */
enum { K_TP_OUT, K_SCENARIO, K_RECOMPUTE, K_TP_STATE, K_CPU_OUT, K_CPU_STATE, K_KINDS };
static double g_worst[K_KINDS];

/* The backend's bar (lh_check_close); the scenarios' comparisons print their ratio. */
static void check_close(const char *what, const double *a, const double *b, int64_t n, double cpu_bar,
                        double gpu_bar, int kind) {
    double bar;
    const double ratio = lh_check_close(what, a, b, n, cpu_bar, gpu_bar, &g_worst[kind], &bar);
    if (kind == K_SCENARIO || kind == K_RECOMPUTE)
        printf("  rank %d %-78s %s = %.2e (bar %.0e)\n", g_rank, what, g_cuda ? "rel RMS" : "max|a-b|/max|b|", ratio,
               bar);
}

/* Compares recorded deltas of (ra, positions pa..) in stack sa with (rb, pb..) in stack sb. */
static void compare_positions(const char *what, int32_t ra, int32_t pa, int32_t rb, int32_t pb, int32_t n, double bar,
                              int kind) {
    const int64_t k = lh_gather_positions(what, ra, pa, rb, pb, n);
    check_close(what, g_a, g_b, k, bar, GPU_BAR_OUT, kind);
}

/* This rank's ssm and conv state of a request in a stack, as doubles. */
static int64_t local_state(const stack *s, int32_t slot, double *out) {
    return lh_local_state(s->gpu, s->cache, slot, out);
}

/* The reference's state restricted to the TP stack's heads and conv channels, in the TP
 * stack's local order (ssm: a head range; conv: each section's slice). */
static int64_t ref_state_as_local(const stack *ref, const stack *tp, int32_t slot, double *out) {
    int64_t k = 0;
    const int64_t NP = tp->shard.config.state_dim * tp->shard.config.head_dim, W = tp->shard.config.conv_width;
    for (int32_t l = 0; l < LAYERS; l++) {
        gdp_tensor ssm, conv;
        gdp_cache_state_views(ref->cache, l, &ssm, &conv);
        const int64_t ns = ssm.shape[1] * NP, nc = conv.shape[1] * W;
        lh_read_floats(ref->gpu, ssm.data, slot * ns + tp->shard.head_begin * NP, tp->shard.num_heads * NP, out + k);
        k += tp->shard.num_heads * NP;
        double *c = malloc(sizeof(double) * (size_t)nc);
        lh_read_floats(ref->gpu, conv.data, slot * nc, nc, c);
        for (int32_t sec = 0; sec < tp->shard.num_conv_sections; sec++) {
            gdp_section se;
            gdp_tp_shard_conv_section(&tp->shard, sec, &se);
            for (int64_t r = 0; r < se.rows; r++)
                for (int64_t w = 0; w < W; w++)
                    out[k++] = c[(se.global_offset + se.slice_begin + r) * W + w];
        }
        free(c);
    }
    return k;
}

static stack g_tp, g_ref, g_cref; /* TP, TP = 1, and (--backend cuda) TP = 1 on the CPU */
static int32_t g_step_no = 0;

static int n_stacks(void) { return g_cuda ? 3 : 2; }
static stack *stack_at(int k) { return k == 0 ? &g_tp : (k == 1 ? &g_ref : &g_cref); }

/* Compares the recorded deltas of every request row of this step in stacks sa and sb. */
static void compare_step_outputs(const char *what, int sa, int sb, const int32_t *tag_req, const int32_t *tag_pos,
                                 int64_t T, int kind) {
    const int64_t n = lh_gather_step_rows(what, sa, sb, tag_req, tag_pos, T);
    if (n > 0)
        check_close(what, g_a, g_b, n, BAR_TP, GPU_BAR_OUT, kind);
}

/* Runs one scheduled step on every stack and checks TP vs reference (and GPU vs CPU). */
static void run_step(const tstep *t) {
    g_step_no++;
    int32_t dec_slots[4], rel_slots[8];
    gdp_prefill_request pre[4];
    gdp_draft_accept acc[4];
    const gdp_step_desc d = lh_make_desc(t, g_req, dec_slots, rel_slots, pre, acc); /* accepts move positions back */
    const int32_t S = d.decode_tokens;
    const gdp_step_metadata *ms[MAX_STACKS] = {NULL};
    const char *names[MAX_STACKS] = {NULL};
    for (int k = 0; k < n_stacks(); k++)
        ms[k] = stack_prepare(stack_at(k), &d), names[k] = stack_at(k)->name;
    const gdp_step_metadata *mt = ms[0];
    lh_agree_on_step(t, ms, n_stacks(), names, g_step_no, g_req);

    /* x: decode rows, prefill rows, seeded padding */
    const int64_t T = mt->padded_token_count;
    float *x = malloc(sizeof(float) * (size_t)(T * D_MODEL));
    int32_t *tag_req = malloc(sizeof(int32_t) * (size_t)T), *tag_pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int64_t row = 0; row < T; row++) {
        tag_req[row] = -1;
        token_row(900000 + g_step_no, (int32_t)row, x + row * D_MODEL);
    }
    for (int32_t i = 0; i < t->n_dec; i++)
        for (int32_t s = 0; s < S; s++) {
            const request *r = &g_req[t->dec[i]];
            const int64_t row = (int64_t)i * S + s;
            tag_req[row] = t->dec[i], tag_pos[row] = r->pos + s;
            token_row(r->seed, r->pos + s, x + row * D_MODEL);
        }
    for (int32_t i = 0; i < t->n_pre; i++)
        for (int32_t k = 0; k < t->tokens[i]; k++) {
            const request *r = &g_req[t->pre[i]];
            const int64_t row = mt->prefill_token_offset + mt->host.cu_seqlens[i] + k;
            tag_req[row] = t->pre[i], tag_pos[row] = r->pos + k;
            token_row(r->seed, r->pos + k, x + row * D_MODEL);
        }

    float *outs[MAX_STACKS][LAYERS];
    for (int k = 0; k < n_stacks(); k++) {
        for (int32_t l = 0; l < LAYERS; l++)
            outs[k][l] = malloc(sizeof(float) * (size_t)(T * D_MODEL));
        stack_forward(stack_at(k), ms[k], x, outs[k]);
    }

    /* record deltas; padding rows must come out exactly as they went in */
    float *xs[MAX_STACKS] = {x, x, x};
    const int64_t pad_changed = lh_record_deltas(n_stacks(), T, xs, outs, tag_req, tag_pos);
    CHECK(pad_changed == 0, "step %d: %lld values of padding rows changed", g_step_no, (long long)pad_changed);
    char what[112];
    snprintf(what, sizeof what, "step %d: layer outputs, tp %d vs tp 1", g_step_no, g_size);
    compare_step_outputs(what, 0, 1, tag_req, tag_pos, T, K_TP_OUT);
    if (g_cuda) {
        snprintf(what, sizeof what, "step %d: layer outputs, GPU tp 1 vs CPU tp 1", g_step_no);
        compare_step_outputs(what, 1, 2, tag_req, tag_pos, T, K_CPU_OUT);
    }

    lh_advance_positions(t, S, g_req);

    /* states of every live request: this rank's share vs the reference's; GPU vs CPU */
    for (int32_t q = 0; q < NREQ; q++) {
        if (!g_req[q].live)
            continue;
        const int64_t na = local_state(&g_tp, g_req[q].slot, g_a);
        const int64_t nb = ref_state_as_local(&g_ref, &g_tp, g_req[q].slot, g_b);
        CHECK(na == nb, "state sizes %lld vs %lld", (long long)na, (long long)nb);
        snprintf(what, sizeof what, "step %d: request %d states, tp %d vs tp 1", g_step_no, q, g_size);
        check_close(what, g_a, g_b, na, BAR_TP, GPU_BAR_STATE, K_TP_STATE);
        if (g_cuda) {
            const int64_t nr = local_state(&g_ref, g_req[q].slot, g_a), nc = local_state(&g_cref, g_req[q].slot, g_b);
            CHECK(nr == nc, "state sizes %lld vs %lld", (long long)nr, (long long)nc);
            snprintf(what, sizeof what, "step %d: request %d states, GPU tp 1 vs CPU tp 1", g_step_no, q);
            check_close(what, g_a, g_b, nr, BAR_TP, GPU_BAR_STATE, K_CPU_STATE);
        }
    }
    for (int k = 0; k < n_stacks(); k++)
        for (int32_t l = 0; l < LAYERS; l++)
            free(outs[k][l]);
    free(x), free(tag_req), free(tag_pos);
}

/* The states of two requests in the TP stack (this rank's share). */
static void compare_states(const char *what, int32_t qa, int32_t qb, double bar, int kind) {
    const int64_t n = local_state(&g_tp, g_req[qa].slot, g_a);
    local_state(&g_tp, g_req[qb].slot, g_b);
    check_close(what, g_a, g_b, n, bar, GPU_BAR_STATE, kind);
}

enum { A, A2, B, B2, C, C2, DD, D2 };
#define NEW GDP_PREFILL_NEW
#define SAVE GDP_PREFILL_SAVE
#define RESTORE GDP_PREFILL_RESTORE

static void scenario_chunked_and_decode(void) {
    g_req[A] = (request){.seed = 1}, g_req[A2] = (request){.seed = 1};
    g_req[B] = (request){.seed = 2}, g_req[B2] = (request){.seed = 2};
    /* A: one prefill of 170 then decodes; A2: the same tokens in chunks 64 + 64 + 43 */
    run_step(&(tstep){.n_pre = 3, .pre = {A, A2, B}, .tokens = {170, 64, 3}, .flags = {NEW, NEW, NEW}});
    run_step(&(tstep){.n_dec = 1, .dec = {A}, .n_pre = 2, .pre = {A2, B}, .tokens = {64, 2}});
    run_step(&(tstep){.n_dec = 1, .dec = {B}, .n_pre = 2, .pre = {A2, B2}, .tokens = {43, 6}, .flags = {0, NEW}});
    compare_positions("A prefilled in chunks 64+64+42 vs one prefill", A2, 0, A, 0, 170, BAR_TP, K_SCENARIO);
    compare_positions("B2 one prefill vs B in chunks 3+2 (last shorter than W)", B, 0, B2, 0, 5, BAR_TP, K_SCENARIO);
    compare_positions("A decode of token 170 vs recomputing it in A2's prefill", A, 170, A2, 170, 1, BAR_RECOMPUTE,
                      K_RECOMPUTE);
    compare_positions("B decode of token 5 vs recomputing it in B2's prefill", B, 5, B2, 5, 1, BAR_RECOMPUTE,
                      K_RECOMPUTE);
    compare_states("A (prefill + decode) vs A2 (chunked prefill of the same 171 tokens) states", A, A2, BAR_RECOMPUTE,
                   K_RECOMPUTE);
    compare_states("B (chunks + decode) vs B2 (one prefill of 6) states", B, B2, BAR_RECOMPUTE, K_RECOMPUTE);
    if (g_rank == 0)
        printf("chunked prefill == one prefill and decode == recompute: checked (steps 1-3)\n");
}

static void scenario_prefix(void) {
    g_req[C] = (request){.seed = 3}, g_req[C2] = (request){.seed = 3, .pos = 128};
    g_req[DD] = (request){.seed = 4}, g_req[D2] = (request){.seed = 4, .pos = 128};
    /* C saves at token 128 inside its 200-token slice, D at the end of its 128-token slice */
    run_step(&(tstep){.n_rel = 4, .rel = {A, A2, B, B2}, .n_pre = 2, .pre = {C, DD}, .tokens = {200, 128},
                      .flags = {NEW | SAVE, NEW | SAVE}, .save = {0, 1}, .save_off = {128, 128}});
    run_step(&(tstep){.n_pre = 3, .pre = {C2, D2, DD}, .tokens = {72, 32, 32},
                      .flags = {NEW | RESTORE, NEW | RESTORE, 0}, .restore = {0, 1, 0}});
    compare_positions("C2 restored at token 128 vs C uninterrupted", C2, 128, C, 128, 72, BAR_TP, K_SCENARIO);
    compare_states("C2 (restored + 72) vs C (200 in one slice) states", C2, C, BAR_TP, K_SCENARIO);
    compare_positions("D2 restored from a slice-end snapshot vs D continuing", D2, 128, DD, 128, 32, BAR_TP,
                      K_SCENARIO);
    compare_states("D2 vs D states", D2, DD, BAR_TP, K_SCENARIO);
    if (g_rank == 0)
        printf("prefix snapshot restore + continue == uninterrupted: checked (steps 4-5)\n");
}

static void scenario_drafts(void) {
    /* D and D2 both hold 160 tokens. Each decodes S = 3 draft tokens and keeps some. */
    run_step(&(tstep){.n_rel = 2, .rel = {C, C2}, .S = 3, .n_dec = 2, .dec = {DD, D2}});
    run_step(&(tstep){.n_acc = 2, .acc = {DD, D2}, .acc_n = {2, 1}, .n_dec = 2, .dec = {DD, D2}}); /* D 162, D2 161 */
    run_step(&(tstep){.n_dec = 2, .dec = {DD, D2}});                                                /* D 163, D2 162 */
    run_step(&(tstep){.n_dec = 2, .dec = {D2, DD}});                                                /* D2 163, D 164 */
    compare_positions("kept draft tokens 160-161 of D (S = 3, n_acc 2) vs D2 one at a time", DD, 160, D2, 160, 2,
                      BAR_TP, K_SCENARIO);
    compare_positions("D after keeping 2 of 3 (tokens 162-163) vs D2 running only those", DD, 162, D2, 162, 2, BAR_TP,
                      K_SCENARIO);
    run_step(&(tstep){.S = 3, .n_dec = 2, .dec = {DD, D2}}); /* D 165-167, D2 164-166 */
    run_step(&(tstep){.n_acc = 2, .acc = {DD, D2}, .acc_n = {3, 3}, .n_dec = 2, .dec = {DD, D2}}); /* D 168, D2 167 */
    compare_positions("D2 token 164 after keeping 1 of 3 vs D", D2, 164, DD, 164, 1, BAR_TP, K_SCENARIO);
    compare_positions("draft tokens 165-166 kept by both (n_acc = S = 3)", D2, 165, DD, 165, 2, BAR_TP, K_SCENARIO);
    compare_positions("D2 token 167 after keeping all 3 vs D's kept draft token", D2, 167, DD, 167, 1, BAR_TP,
                      K_SCENARIO);
    run_step(&(tstep){.n_dec = 1, .dec = {D2}}); /* D2 168: both hold 169 tokens */
    compare_positions("token 168", D2, 168, DD, 168, 1, BAR_TP, K_SCENARIO);
    compare_states("D vs D2 after the same 169 tokens through different draft acceptances", DD, D2, BAR_TP, K_SCENARIO);
    if (g_rank == 0)
        printf("draft tokens: keeping n_acc of S = 3 (n_acc 1, 2, 3) == running only those tokens: checked (steps "
               "6-12)\n");
}

/* Bad input: an error on every rank, nothing modified. */
static void scenario_bad_input(const char *path) {
    /* a step in flight: D decodes one token */
    const int32_t dslot[1] = {g_req[DD].slot};
    gdp_step_desc d = {.decode_count = 1, .decode_tokens = 1, .decode_slots = dslot, .bucket = GDP_BUCKET_AUTO};
    const gdp_step_metadata *m = stack_prepare(&g_tp, &d);
    int64_t first, count;
    local_rows(&g_tp, m->padded_token_count, &first, &count);
    const int64_t ns = local_state(&g_tp, g_req[DD].slot, g_a);
    const size_t x_bytes = sizeof(float) * (size_t)((count + 1) * D_MODEL);
    float *x = calloc((size_t)((count + 1) * D_MODEL), sizeof(float));
    for (int64_t i = 0; i < (count + 1) * D_MODEL; i++)
        x[i] = (float)(i % 7);
    float *x_copy = malloc(x_bytes);
    memcpy(x_copy, x, x_bytes);
    void *xd = x; /* x where the backend reads it */
    if (g_tp.gpu) {
        xd = dev_alloc(x_bytes);
        dev_upload(xd, x, x_bytes);
    }
    gdp_tensor xt;
    gdp_tensor_init(&xt, xd, GDP_DTYPE_FP32, 2, (const int64_t[]){count + 1, D_MODEL});
    CHECK_STATUS(gdp_layer_forward(g_tp.layers[0], g_tp.cache, m, &xt), GDP_STATUS_INVALID_ARGUMENT);
    char want[64];
    snprintf(want, sizeof want, "[%lld, %d]", (long long)(count + 1), D_MODEL);
    CHECK(strstr(gdp_last_error(), want) != NULL, "rank %d: wrong-shape message '%s' lacks %s", g_rank,
          gdp_last_error(), want);
    if (g_tp.gpu)
        dev_download(x, xd, x_bytes);
    CHECK(!memcmp(x, x_copy, x_bytes), "a refused forward modified x");
    local_state(&g_tp, g_req[DD].slot, g_b);
    CHECK(!memcmp(g_a, g_b, sizeof(double) * (size_t)ns), "a refused forward modified the cache");
    /* metadata built but not applied: refused */
    CHECK_OK(gdp_plan_bcast(g_tp.plan, g_tp.comm, 0, &d));
    CHECK_OK(gdp_plan_build(g_tp.plan, g_tp.cache, g_tp.comm, &m));
    gdp_tensor_init(&xt, xd, GDP_DTYPE_FP32, 2, (const int64_t[]){count, D_MODEL});
    CHECK_STATUS(gdp_layer_forward(g_tp.layers[0], g_tp.cache, m, &xt), GDP_STATUS_INVALID_USAGE);
    if (g_tp.gpu)
        dev_download(x, xd, x_bytes);
    CHECK(!memcmp(x, x_copy, x_bytes), "a refused forward modified x");
    local_state(&g_tp, g_req[DD].slot, g_b);
    CHECK(!memcmp(g_a, g_b, sizeof(double) * (size_t)ns), "a refused forward modified the cache");
    /* sequence parallel over rows it cannot split */
    if (g_sp && g_size > 1) {
        d.bucket = ODD_BUCKET;
        m = stack_prepare(&g_tp, &d);
        const size_t odd_bytes = sizeof(float) * ODD_ROWS * D_MODEL;
        void *odd = g_tp.gpu ? dev_alloc(odd_bytes) : calloc(ODD_ROWS * D_MODEL, sizeof(float));
        gdp_tensor_init(&xt, odd, GDP_DTYPE_FP32, 2, (const int64_t[]){ODD_ROWS / g_size, D_MODEL});
        CHECK_STATUS(gdp_layer_forward(g_tp.layers[0], g_tp.cache, m, &xt), GDP_STATUS_INVALID_ARGUMENT);
        snprintf(want, sizeof want, "%d token rows over tp = %d", ODD_ROWS, g_size);
        CHECK(strstr(gdp_last_error(), want) != NULL, "rank %d: message '%s' lacks '%s'", g_rank, gdp_last_error(),
              want);
        if (g_tp.gpu)
            dev_free(odd);
        else
            free(odd);
    }
    /* weights of another rank */
    if (g_size > 1) {
        gdp_checkpoint_t ck = NULL;
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        CHECK_OK(gdp_checkpoint_open(&ck, path));
        CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w, 0, (g_rank + 1) % g_size, g_size));
        gdp_layer_t bad = (gdp_layer_t)&w;
        CHECK_STATUS(gdp_layer_init(&bad, g_ctx, g_comm, &w, g_tp.mode), GDP_STATUS_INVALID_ARGUMENT);
        CHECK(bad == NULL, "*out not reset by a failing gdp_layer_init");
        snprintf(want, sizeof want, "tp rank %d of %d", (g_rank + 1) % g_size, g_size);
        CHECK(strstr(gdp_last_error(), want) != NULL, "rank %d: message '%s' lacks '%s'", g_rank, gdp_last_error(),
              want);
        gdp_layer_weights_free(&w);
        gdp_checkpoint_free(ck);
    }
    if (g_tp.gpu)
        dev_free(xd);
    free(x), free(x_copy);
    if (g_rank == 0)
        printf("bad input: wrong x shape, unapplied metadata%s%s refused on every rank, nothing modified\n",
               g_sp && g_size > 1 ? ", unsplittable rows" : "", g_size > 1 ? ", another rank's weights" : "");
}

/* --backend cuda: 1 when this rank can run the test (a CUDA build, a visible GPU, NCCL when
 * asked for it, and with NCCL a GPU per rank of the node); else 0 and the reason in why. */
static int gpu_usable(char *why, size_t n) {
    int count = 0;
    if (!test_gpu_usable(why, n, &count))
        return 0;
    if (g_nccl) {
        if (!gdp_comm_backend_available(GDP_COMM_NCCL)) {
            snprintf(why, n, "this libgdp has no NCCL backend");
            return 0;
        }
        MPI_Comm node;
        int local = 1;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
        if (local > count) {
            snprintf(why, n, "NCCL needs a GPU per rank: %d ranks share this node's %d GPUs", local, count);
            return 0;
        }
    }
    return 1;
}

static void usage_fatal(const char *arg) {
    GDP_FATAL(NULL, "test_layer_tp: unknown argument '%s'; usage: test_layer_tp [--sp] [--backend cpu|cuda] "
              "[--comm mpi|nccl]", arg);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sp"))
            g_sp = true;
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc && !strcmp(argv[i + 1], "cuda"))
            g_cuda = true, i++;
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc && !strcmp(argv[i + 1], "cpu"))
            g_cuda = false, i++;
        else if (!strcmp(argv[i], "--comm") && i + 1 < argc && !strcmp(argv[i + 1], "nccl"))
            g_nccl = true, i++;
        else if (!strcmp(argv[i], "--comm") && i + 1 < argc && !strcmp(argv[i + 1], "mpi"))
            g_nccl = false, i++;
        else
            usage_fatal(argv[i]);
    }
    if (g_nccl && !g_cuda)
        usage_fatal("--comm nccl (needs --backend cuda)");
    const char *name = g_cuda ? (g_sp ? "test_layer_tp_gpu_sp" : "test_layer_tp_gpu")
                              : (g_sp ? "test_layer_tp_sp" : "test_layer_tp");
    if (g_cuda) {
        /* Every rank skips, or none: a rank alone would leave the others in a collective. */
        char why[160] = "";
        const int usable = gpu_usable(why, sizeof why);
        if (!test_gpu_all_ranks_usable(usable, name, why)) {
            MPI_Finalize();
            return TEST_SKIP;
        }
    }
    const gdp_comm_backend_t comm_backend = g_nccl ? GDP_COMM_NCCL : GDP_COMM_MPI;
    GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&g_comm, comm_backend, NULL,
                                           g_cuda ? GDP_COMM_DEVICE_BUFFERS : GDP_COMM_HOST_BUFFERS));
    lh_fatal_comm = g_comm;
    lh_ctx_init(g_comm);

    /* one global checkpoint, written by rank 0 */
    char path[256];
    long job = (long)getpid();
    MPI_Bcast(&job, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "%s/gdp_test_layer_tp_%ld.safetensors", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             job);
    gdp_layer_config cfg;
    gdp_layer_config_default(&cfg);
    cfg.hidden_size = D_MODEL, cfg.num_heads = 8, cfg.num_groups = 4, cfg.head_dim = 16, cfg.state_dim = 16;
    cfg.num_householder = 2, cfg.num_layers = LAYERS;
    if (g_rank == 0)
        GDP_FATAL_IF_ERROR(g_comm, gdp_checkpoint_write_synthetic(path, &cfg, 1234, GDP_DTYPE_FP32));
    MPI_Barrier(MPI_COMM_WORLD);
    const gdp_tp_mode_t mode = g_sp ? GDP_TP_MODE_SEQUENCE_PARALLEL : GDP_TP_MODE_ALLREDUCE;
    stack_init(&g_tp, "tp", path, g_ctx, g_comm, mode);
    stack_init(&g_ref, "tp1", path, g_ctx, NULL, GDP_TP_MODE_ALLREDUCE);
    if (g_cuda)
        stack_init(&g_cref, "cpu tp1", path, g_cpu_ctx, NULL, GDP_TP_MODE_ALLREDUCE);
    if (g_rank == 0) {
        const char *comm_name = "?";
        gdp_comm_name(g_comm, &comm_name);
        printf("# gdp layer stack: %d layers, D=%d H=%lld G=%lld P=%lld N=%lld M=%d, tp %d (%s) vs tp 1, %s backend%s, "
               "comm %s\n",
               LAYERS, D_MODEL, (long long)cfg.num_heads, (long long)cfg.num_groups, (long long)cfg.head_dim,
               (long long)cfg.state_dim, cfg.num_householder, g_size, gdp_tp_mode_name(mode), g_cuda ? "CUDA" : "CPU",
               g_cuda ? " (and CPU tp 1)" : "", comm_name);
    }
    g_a = malloc(sizeof(double) * SCRATCH);
    g_b = malloc(sizeof(double) * SCRATCH);

    scenario_chunked_and_decode();
    scenario_prefix();
    scenario_drafts();
    scenario_bad_input(path);

    stack_free(&g_tp);
    stack_free(&g_ref);
    if (g_cuda)
        stack_free(&g_cref);
    free(g_a), free(g_b);
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0)
        remove(path);
    double worst[K_KINDS];
    MPI_Allreduce(g_worst, worst, K_KINDS, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("# worst %s: tp vs tp1 %.2e, chunked/restore/drafts %.2e, decode vs recompute %.2e, states tp vs tp1 "
               "%.2e\n",
               g_cuda ? "relative RMS" : "max|a-b|/max|b|", worst[K_TP_OUT], worst[K_SCENARIO], worst[K_RECOMPUTE],
               worst[K_TP_STATE]);
        if (g_cuda)
            printf("# worst relative RMS, GPU tp 1 vs CPU tp 1: outputs %.2e, states %.2e\n", worst[K_CPU_OUT],
                   worst[K_CPU_STATE]);
    }
    lh_ctx_free();
    CHECK_OK(gdp_comm_free(g_comm));
    return lh_finish(name);
}
