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

/* ---- the stacks: the TP one (its shard of every layer) and the TP = 1 references --------- */
static lh_stack g_tp, g_ref, g_cref; /* TP, TP = 1, and (--backend cuda) TP = 1 on the CPU */

/* comm NULL: a TP = 1 reference of the whole layer. */
static void stack_init(lh_stack *s, const char *name, const char *path, gdp_ctx_t ctx, gdp_comm_t comm,
                       gdp_tp_mode_t mode) {
    lh_stack_begin(s, name, ctx, comm, mode);
    const int32_t tp_rank = comm ? g_rank : 0, tp_size = comm ? g_size : 1;
    if (comm != NULL && mode == GDP_TP_MODE_SEQUENCE_PARALLEL)
        s->row_blocks = tp_size, s->row_block = tp_rank;
    gdp_tp_shard shard;
    memset(&shard, 0, sizeof shard);
    gdp_checkpoint_t ck = NULL;
    GDP_FATAL_IF_ERROR(g_comm, gdp_checkpoint_open(&ck, path));
    for (int32_t l = 0; l < LAYERS; l++) {
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        GDP_FATAL_IF_ERROR(g_comm, gdp_checkpoint_load_layer_shard(ck, &w, l, tp_rank, tp_size));
        GDP_FATAL_IF_ERROR(g_comm, gdp_layer_init(&s->layers[l], ctx, comm, &w, mode));
        shard = w.shard;
        gdp_layer_weights_free(&w);
    }
    gdp_checkpoint_free(ck);
    /* the activation dtype it reports (what a cache's conv_dtype may take to hold the windows exactly) */
    gdp_backend_t backend = GDP_BACKEND_CPU;
    gdp_dtype_t act = GDP_DTYPE_INT32;
    CHECK_OK(gdp_ctx_get_backend(ctx, &backend));
    CHECK_OK(gdp_layer_get_act_dtype(s->layers[0], &act));
    CHECK(act == (backend == GDP_BACKEND_CPU ? GDP_DTYPE_FP32 : GDP_DTYPE_BF16), "%s: gdp_layer_get_act_dtype gave %s",
          name, gdp_dtype_name(act));
    CHECK_STATUS(gdp_layer_get_act_dtype(s->layers[0], NULL), GDP_STATUS_INVALID_ARGUMENT);
    /* the state it holds: a head range, and each conv section's slice */
    s->head_begin = shard.head_begin, s->num_heads = shard.num_heads;
    CHECK(shard.num_conv_sections <= LH_MAX_CONV_RANGES, "%d conv sections", shard.num_conv_sections);
    s->n_conv_ranges = shard.num_conv_sections;
    for (int32_t sec = 0; sec < shard.num_conv_sections; sec++) {
        gdp_section se;
        GDP_FATAL_IF_ERROR(g_comm, gdp_tp_shard_conv_section(&shard, sec, &se));
        s->conv_begin[sec] = se.global_offset + se.slice_begin, s->conv_rows[sec] = se.rows;
    }
    gdp_cache_config cc;
    GDP_FATAL_IF_ERROR(g_comm, gdp_cache_config_init(&cc, &shard, N_SLOTS));
    lh_stack_finish(s, &cc, shard.config.num_householder, k_buckets, N_BUCKETS, comm != NULL);
}

/* ---- the scheduled requests (request, tstep, token_row, g_rec: the harness's) ------------ */
static request g_req[NREQ];

static void scenario_drafts(void) {
    /* D and D2 both hold 160 tokens. Each decodes S = 3 draft tokens and keeps some. */
    lh_run_step(&(tstep){.n_rel = 2, .rel = {C, C2}, .S = 3, .n_dec = 2, .dec = {DD, D2}});
    lh_run_step(&(tstep){.n_acc = 2, .acc = {DD, D2}, .acc_n = {2, 1}, .n_dec = 2, .dec = {DD, D2}}); /* D 162, D2 161 */
    lh_run_step(&(tstep){.n_dec = 2, .dec = {DD, D2}});                                                /* D 163, D2 162 */
    lh_run_step(&(tstep){.n_dec = 2, .dec = {D2, DD}});                                                /* D2 163, D 164 */
    compare_positions("kept draft tokens 160-161 of D (S = 3, n_acc 2) vs D2 one at a time", DD, 160, D2, 160, 2,
                      BAR_TP, K_SCENARIO);
    compare_positions("D after keeping 2 of 3 (tokens 162-163) vs D2 running only those", DD, 162, D2, 162, 2, BAR_TP,
                      K_SCENARIO);
    lh_run_step(&(tstep){.S = 3, .n_dec = 2, .dec = {DD, D2}}); /* D 165-167, D2 164-166 */
    lh_run_step(&(tstep){.n_acc = 2, .acc = {DD, D2}, .acc_n = {3, 3}, .n_dec = 2, .dec = {DD, D2}}); /* D 168, D2 167 */
    compare_positions("D2 token 164 after keeping 1 of 3 vs D", D2, 164, DD, 164, 1, BAR_TP, K_SCENARIO);
    compare_positions("draft tokens 165-166 kept by both (n_acc = S = 3)", D2, 165, DD, 165, 2, BAR_TP, K_SCENARIO);
    compare_positions("D2 token 167 after keeping all 3 vs D's kept draft token", D2, 167, DD, 167, 1, BAR_TP,
                      K_SCENARIO);
    lh_run_step(&(tstep){.n_dec = 1, .dec = {D2}}); /* D2 168: both hold 169 tokens */
    compare_positions("token 168", D2, 168, DD, 168, 1, BAR_TP, K_SCENARIO);
    compare_states("D vs D2 after the same 169 tokens through different draft acceptances", DD, D2, BAR_TP, K_SCENARIO);
    if (g_rank == 0)
        printf("draft tokens: keeping n_acc of S = 3 (n_acc 1, 2, 3) == running only those tokens: checked (steps "
               "6-12)\n");
}

/* Bad input: an error on every rank, nothing modified. */
static void scenario_bad_input(const char *path) {
    /* a step in flight: D decodes one token; x of the wrong shape, unapplied metadata */
    lh_refusal r;
    lh_refusal_begin(&r, &g_tp, g_req[DD].slot);
    lh_refuse_shape_and_unapplied(&r);
    char want[64];
    /* sequence parallel over rows it cannot split */
    if (g_sp && g_size > 1) {
        gdp_step_desc d = r.d;
        d.bucket = ODD_BUCKET;
        const gdp_step_metadata *m = lh_stack_prepare(&g_tp, &d);
        const size_t odd_bytes = sizeof(float) * ODD_ROWS * D_MODEL;
        void *odd = g_tp.gpu ? dev_alloc(odd_bytes) : calloc(ODD_ROWS * D_MODEL, sizeof(float));
        snprintf(want, sizeof want, "%d token rows over tp = %d", ODD_ROWS, g_size);
        lh_check_refused(&g_tp, g_tp.cache, m, odd, ODD_ROWS / g_size, GDP_STATUS_INVALID_ARGUMENT, want);
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
    lh_refusal_end(&r);
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
    lh_mpi_init(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        if (lh_common_arg(argc, argv, &i))
            continue;
        if (!strcmp(argv[i], "--comm") && i + 1 < argc && !strcmp(argv[i + 1], "nccl"))
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
    if (lh_skip_without_gpu(name, gpu_usable))
        return TEST_SKIP;
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
    g_job = (lh_job){.stacks = {&g_tp, &g_ref, &g_cref}, .n_stacks = g_cuda ? 3 : 2, .reqs = g_req, .n_reqs = NREQ,
                     .bar = BAR_TP, .print_every_rank = true};
    snprintf(g_job.vs, sizeof g_job.vs, "tp %d vs tp 1", g_size);

    lh_scenario_chunked_and_decode();
    if (g_rank == 0)
        printf("chunked prefill == one prefill and decode == recompute: checked (steps 1-3)\n");
    lh_scenario_prefix();
    if (g_rank == 0)
        printf("prefix snapshot restore + continue == uninterrupted: checked (steps 4-5)\n");
    scenario_drafts();
    scenario_bad_input(path);

    double worst[K_KINDS];
    lh_job_end(worst);
    if (g_rank == 0)
        remove(path);
    if (g_rank == 0) {
        printf("# worst %s: tp vs tp1 %.2e, chunked/restore/drafts %.2e, decode vs recompute %.2e, states tp vs tp1 "
               "%.2e\n",
               g_cuda ? "relative RMS" : "max|a-b|/max|b|", worst[K_OUT], worst[K_SCENARIO], worst[K_RECOMPUTE],
               worst[K_STATE]);
        if (g_cuda)
            printf("# worst relative RMS, GPU tp 1 vs CPU tp 1: outputs %.2e, states %.2e\n", worst[K_CPU_OUT],
                   worst[K_CPU_STATE]);
    }
    lh_ctx_free();
    CHECK_OK(gdp_comm_free(g_comm));
    return lh_finish(name);
}
