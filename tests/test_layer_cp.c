/*
 * test_layer_cp.c: the context-parallel GDP layer stack (gdp-layer.md 3.1, docs/cp.md), under
 * mpirun, on the CPU backend (default) or the CUDA backend (--backend cuda).
 *
 * The job is tp x cp ranks (--tp T, default 1; cp = ranks / tp), laid out as
 * rank = tp_rank + tp * cp_rank (gdp_parallel_ranks): a TP comm per CP rank and a CP comm per
 * TP rank, both over MPI sub-communicators, plus a job-wide comm for the step plan (every rank
 * holds the same global step). Rank 0 writes one seeded global checkpoint (2 layers, fp32,
 * H = 8, --groups G groups, default 4, and a 64-token vocabulary). Every rank then runs two
 * stacks over the same scheduled steps: the CP stack (its TP shard, sliced by its CP rank,
 * with all-reduce or, with --sp, sequence parallel inside the TP group) and a TP = CP = 1
 * reference of the whole layer, each with its own state cache and plan. The CP stack's x holds
 * the rank's contiguous 1/cp of every step's padded rows (its TP block of them with --sp).
 * Checks (gdp-math.md 8.1, CPU bars):
 *   - the CP arithmetic on its own: for many (H, G, tp, cp), gdp_cp_shard_init's slices tile
 *     every TP shard's heads, each CP rank's heads use exactly its group (replicated groups
 *     when G/tp < cp), the core layout is contiguous; invalid sizes are refused naming them;
 *   - every step: each layer's output (its residual delta) of the CP stack vs the reference,
 *     max|a - b| <= 1e-5 max|b|; this rank's heads of every live slot's ssm state and its
 *     channels of the conv state vs the reference's, same bar; padding rows come out exactly
 *     as they went in; the step's metadata is identical on every rank of the job;
 *   - uneven varlen packs ({170, 64, 3}, {64, 2}, {43, 6}, {200, 128}, {72, 32, 32}), whose
 *     requests straddle the CP ranks' row blocks; chunked prefill equals one prefill (1e-5);
 *     decode after prefill equals recomputing (1e-4); prefix snapshots restore (1e-5); draft
 *     tokens roll back (1e-5), as test_layer_tp checks them for TP;
 *   - generated tokens: three prompts of uneven lengths (37, 5, 90) prefilled in one step, then
 *     greedy decoding with the requests sharded across the CP ranks (a decode bucket of 4 rows:
 *     each CP rank holds 4/cp requests' tokens); logits = tied LM head of the final RMSNorm.
 *     Tokens must be identical to the reference's up to the first step where either run's
 *     top-2 logit margin is below the logit bar (from there on, no claim; gdp-math.md 8.1),
 *     logits within the bar until then, layer outputs and states every step as above;
 *   - gdp-run's engine over a CP model (gdp_model_init_cp, the job's comm) vs a tp 1 cp 1
 *     engine: a synthetic workload with draft tokens and preemption; generated tokens
 *     identical up to the first near-tie, by the same rule;
 *   - bad input, an error on every rank with x and the cache unchanged: x of the wrong shape,
 *     a cache sized for the TP shard instead of the CP shard, a bucket whose rows do not split
 *     over cp (also refused by gdp_plan_check_token_split), a checkpoint whose G/tp breaks the
 *     group rule (gdp_layer_init_cp), another TP rank's weights.
 * With --backend cuda (labels gpu;mpi) both stacks run on the GPU (bf16 activations, fp32
 * states) with the MPI comm on device buffers (host-staged: the ranks may share one GPU),
 * plus a third TP = 1 stack on the CPU backend; every comparison then uses the GPU bars of
 * gdp-math.md 8.1 (relative RMS <= 2e-2 on layer outputs, <= 8e-3 on states, <= 5e-2 on
 * logits) and each step also compares the GPU reference with the CPU one. Without a GPU on any
 * rank every rank exits 77 (skipped).
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
#include "gdp/config.h"
#include "gdp/engine.h"
#include "gdp/layer.h"
#include "gdp/model.h"
#include "gdp/plan.h"
#include "layer_harness.h"
#include "test_common.h"

#define HEADS 8
#define VOCAB 64
#define NREQ 11
_Static_assert(NREQ <= LH_MAX_REQ, "the harness records LH_MAX_REQ requests");
#define GEN_STEPS 8

/* CPU backend: max|a - b| <= bar * max|b| (gdp-math.md 8.1, CPU); BAR_RECOMPUTE, GPU_BAR_OUT
 * and GPU_BAR_STATE (relative RMS, gdp-math.md 8.1, GPU) are the harness's. */
#define BAR_CP 1e-5        /* CP vs reference, chunked prefill, prefix restore, draft rollback */
#define GPU_BAR_LOGITS 5e-2 /* model logits (Megatron's bar) */

static int32_t g_tp = 1, g_cp = 1, g_tp_rank = 0, g_cp_rank = 0;
static int64_t g_groups = 4;
static gdp_comm_t g_world;   /* every rank: the step plan's comm            */
static gdp_comm_t g_tp_comm; /* this rank's TP group (NULL for tp = 1)      */
static gdp_comm_t g_cp_comm; /* this rank's CP group                        */

/* Buckets: mixed steps of 256 and 512 rows, a decode-only bucket of 4 rows (the generation's
 * decode steps: 4/cp requests per CP rank), and 513 rows, which no cp > 1 splits. */
static const gdp_step_bucket k_buckets[] = {{4, 4, 256}, {4, 4, 512}, {4, 0, 4}, {1, 1, 513}};
#define N_BUCKETS 4
#define ODD_BUCKET 3
#define ODD_ROWS 513

/* ---- the CP arithmetic on its own ------------------------------------------------------ */

/* For one (H, G, tp, cp): every TP rank's CP slices tile its heads, V/b/a slices tile their
 * sections, K/Q slices are the group(s) of the rank's heads, the core layout is contiguous. */
static void check_cp_layout(int64_t H, int64_t G, int32_t tp, int32_t cp) {
    gdp_layer_config cfg;
    gdp_layer_config_default(&cfg);
    cfg.hidden_size = 16, cfg.num_heads = H, cfg.num_groups = G, cfg.head_dim = 4, cfg.state_dim = 8;
    cfg.num_householder = 2;
    const int32_t M = cfg.num_householder, n_sec = 3 * M + 3;
    for (int32_t t = 0; t < tp; t++) {
        gdp_tp_shard ts;
        CHECK_OK(gdp_tp_shard_init(&ts, &cfg, t, tp));
        int64_t *covered = calloc((size_t)(ts.in_proj_dim), sizeof(int64_t));
        for (int32_t c = 0; c < cp; c++) {
            gdp_cp_shard cs;
            CHECK_OK(gdp_cp_shard_init(&cs, &ts, c, cp));
            CHECK(cs.num_heads * cp == ts.num_heads && cs.head_begin == c * cs.num_heads,
                  "H %lld G %lld tp %d cp %d: rank %d heads %lld from %lld", (long long)H, (long long)G, tp, cp, c,
                  (long long)cs.num_heads, (long long)cs.head_begin);
            CHECK(cs.num_heads % cs.num_groups == 0 && cs.group_begin + cs.num_groups <= ts.num_groups,
                  "H %lld G %lld tp %d cp %d: rank %d groups %lld from %lld of %lld", (long long)H, (long long)G, tp,
                  cp, c, (long long)cs.num_groups, (long long)cs.group_begin, (long long)ts.num_groups);
            /* GQA: the core's head i uses its group i / (H_c / G_c), which must be the TP shard's
             * group of that head, (head_begin + i) / (H_t / G_t). */
            for (int64_t i = 0; i < cs.num_heads; i++) {
                const int64_t core_group = cs.group_begin + i / (cs.num_heads / cs.num_groups);
                const int64_t tp_group = (cs.head_begin + i) / (ts.num_heads / ts.num_groups);
                CHECK(core_group == tp_group, "H %lld G %lld tp %d cp %d: rank %d head %lld uses group %lld, not %lld",
                      (long long)H, (long long)G, tp, cp, c, (long long)i, (long long)core_group,
                      (long long)tp_group);
            }
            int64_t core = 0;
            for (int32_t i = 0; i < n_sec; i++) {
                gdp_cp_section sec;
                CHECK_OK(gdp_cp_shard_in_proj_section(&cs, i, &sec));
                CHECK(sec.core_offset == core, "section %s core offset %lld, expected %lld", sec.tp.name,
                      (long long)sec.core_offset, (long long)core);
                CHECK(sec.slice_begin >= 0 && sec.slice_begin + sec.rows <= sec.tp.rows,
                      "section %s slice [%lld, +%lld) outside its %lld rows", sec.tp.name,
                      (long long)sec.slice_begin, (long long)sec.rows, (long long)sec.tp.rows);
                core += sec.rows;
                for (int64_t r = 0; r < sec.rows; r++)
                    covered[sec.tp.local_offset + sec.slice_begin + r]++;
                if (i > 0 && i <= 2 * M + 1) { /* a conv section: the same slice, conv offsets */
                    gdp_cp_section cv;
                    CHECK_OK(gdp_cp_shard_conv_section(&cs, i - 1, &cv));
                    CHECK(cv.core_offset == sec.core_offset && cv.rows == sec.rows &&
                              cv.slice_begin == sec.slice_begin && cv.tp.local_offset + ts.d_inner == sec.tp.local_offset,
                          "conv section %d differs from in_proj section %d", i - 1, i);
                }
            }
            CHECK(core == cs.core_dim && cs.core_dim == cs.conv_dim + (M + 1) * cs.num_heads,
                  "core columns %lld, core_dim %lld, conv_dim %lld", (long long)core, (long long)cs.core_dim,
                  (long long)cs.conv_dim);
        }
        /* z is never exchanged; V, b, a rows exactly once; K, Q rows group_repeat times */
        gdp_cp_shard c0;
        CHECK_OK(gdp_cp_shard_init(&c0, &ts, 0, cp));
        for (int32_t i = 0; i < n_sec; i++) {
            gdp_section sec;
            CHECK_OK(gdp_tp_shard_in_proj_section(&ts, i, &sec));
            const int64_t want = sec.kind == GDP_SECTION_Z ? 0
                                 : (sec.kind == GDP_SECTION_K || sec.kind == GDP_SECTION_Q) ? c0.group_repeat
                                                                                              : 1;
            int64_t bad = 0;
            for (int64_t r = 0; r < sec.rows; r++)
                bad += covered[sec.local_offset + r] != want;
            CHECK(bad == 0, "H %lld G %lld tp %d cp %d: %lld rows of section %s are not sent %lld times",
                  (long long)H, (long long)G, tp, cp, (long long)bad, sec.name, (long long)want);
        }
        free(covered);
    }
}

static void check_cp_refused(int64_t H, int64_t G, int32_t tp, int32_t cp, const char *want) {
    gdp_layer_config cfg;
    gdp_layer_config_default(&cfg);
    cfg.hidden_size = 16, cfg.num_heads = H, cfg.num_groups = G, cfg.head_dim = 4, cfg.state_dim = 8;
    gdp_tp_shard ts;
    CHECK_OK(gdp_tp_shard_init(&ts, &cfg, 0, tp));
    gdp_cp_shard cs;
    memset(&cs, 0x5a, sizeof cs);
    CHECK_STATUS(gdp_cp_shard_init(&cs, &ts, 0, cp), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), want) != NULL, "H %lld G %lld tp %d cp %d: message '%s' lacks '%s'", (long long)H,
          (long long)G, tp, cp, gdp_last_error(), want);
    CHECK(((const unsigned char *)&cs)[0] == 0x5a, "a refused gdp_cp_shard_init wrote its output");
}

static void scenario_arithmetic(void) {
    /* G/tp >= cp (divisible), G/tp == cp, G/tp < cp (replicated groups, repeat 2 and 4), cp = 1 */
    const int64_t cases[][4] = {{8, 4, 1, 2}, {8, 4, 2, 2}, {8, 2, 2, 2}, {8, 1, 1, 2}, {8, 2, 1, 4}, {16, 8, 2, 4},
                                {16, 2, 2, 4}, {8, 8, 1, 8}, {12, 6, 3, 2}, {8, 4, 4, 1}, {24, 3, 3, 8}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_cp_layout(cases[i][0], cases[i][1], (int32_t)cases[i][2], (int32_t)cases[i][3]);
    check_cp_refused(6, 6, 1, 4, "heads H/tp = 6");          /* H/tp % cp != 0                */
    check_cp_refused(12, 6, 2, 2, "groups G/tp = 3");         /* G/tp >= cp, not divisible     */
    check_cp_refused(12, 4, 2, 3, "groups G/tp = 2");         /* G/tp < cp, cp % (G/tp) != 0   */
    check_cp_refused(8, 4, 1, 0, "cp_size = 0");
    int32_t tr, cr, cs;
    CHECK_OK(gdp_parallel_ranks(5, 8, 2, &tr, &cr, &cs));
    CHECK(tr == 1 && cr == 2 && cs == 4, "rank 5 of 8 at tp 2: tp_rank %d cp_rank %d cp %d", tr, cr, cs);
    CHECK_STATUS(gdp_parallel_ranks(0, 6, 4, &tr, &cr, &cs), GDP_STATUS_INVALID_ARGUMENT);
    if (g_rank == 0)
        printf("CP arithmetic: slices, groups and core layout of 11 (H, G, tp, cp) cases; 4 invalid ones refused\n");
}

/* ---- the stacks: the CP one (its TP shard sliced by its CP rank) and the references ------- */
static lh_stack g_cps, g_ref, g_cref; /* CP stack, TP = CP = 1, and (--backend cuda) TP = 1 on the CPU */
static gdp_cp_shard g_cps_shard;      /* the CP stack's shard                                       */

/* cp: the CP stack (its plan over the job); else a single-rank TP = CP = 1 reference. x holds
 * the CP rank's block of T / cp rows (its TP block of those with sequence parallel); with
 * all-reduce inside the TP group the outputs are assembled from TP rank 0's copy. */
static void stack_init(lh_stack *s, const char *name, const char *path, gdp_ctx_t ctx, bool cp, gdp_tp_mode_t mode) {
    lh_stack_begin(s, name, ctx, cp ? g_world : NULL, mode);
    if (cp && mode == GDP_TP_MODE_SEQUENCE_PARALLEL && g_tp > 1)
        s->row_blocks = g_cp * g_tp, s->row_block = g_cp_rank * g_tp + g_tp_rank;
    else if (cp)
        s->row_blocks = g_cp, s->row_block = g_cp_rank, s->row_owner = g_tp_rank == 0;
    gdp_checkpoint_t ck = NULL;
    GDP_FATAL_IF_ERROR(g_world, gdp_checkpoint_open(&ck, path));
    for (int32_t l = 0; l < LAYERS; l++) {
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        GDP_FATAL_IF_ERROR(g_world, gdp_checkpoint_load_layer_shard(ck, &w, l, cp ? g_tp_rank : 0, cp ? g_tp : 1));
        GDP_FATAL_IF_ERROR(g_world, gdp_layer_init_cp(&s->layers[l], ctx, cp ? g_tp_comm : NULL,
                                                      cp ? g_cp_comm : NULL, &w, mode));
        gdp_layer_weights_free(&w);
    }
    gdp_checkpoint_free(ck);
    gdp_cp_shard cs;
    GDP_FATAL_IF_ERROR(g_world, gdp_layer_get_cp_shard(s->layers[0], &cs));
    if (cp)
        g_cps_shard = cs;
    /* the state it holds: its core's heads (TP head_begin + CP head_begin ..) and its conv
     * channels, section by section in the core's order */
    s->head_begin = cs.tp.head_begin + cs.head_begin, s->num_heads = cs.num_heads;
    CHECK(cs.tp.num_conv_sections <= LH_MAX_CONV_RANGES, "%d conv sections", cs.tp.num_conv_sections);
    s->n_conv_ranges = cs.tp.num_conv_sections;
    for (int32_t sec = 0; sec < cs.tp.num_conv_sections; sec++) {
        gdp_cp_section se;
        GDP_FATAL_IF_ERROR(g_world, gdp_cp_shard_conv_section(&cs, sec, &se));
        s->conv_begin[sec] = se.tp.global_offset + se.tp.slice_begin + se.slice_begin, s->conv_rows[sec] = se.rows;
    }
    gdp_cache_config cc;
    GDP_FATAL_IF_ERROR(g_world, gdp_cache_config_init_cp(&cc, &cs, N_SLOTS));
    lh_stack_finish(s, &cc, cs.tp.config.num_householder, k_buckets, N_BUCKETS, cp);
}

/* ---- the scheduled requests (request, tstep, token_row, g_rec: the harness's) ------------ */
static request g_req[NREQ];
enum { G0 = LH_SCENARIO_REQS, G1, G2 }; /* the generation's requests */

static void scenario_drafts(void) {
    /* D and D2 both hold 160 tokens. Each decodes S = 3 draft tokens and keeps some; the
     * comments give the tokens each holds after the step. */
    lh_run_step(&(tstep){.n_rel = 2, .rel = {C, C2}, .S = 3, .n_dec = 2, .dec = {DD, D2}});
    lh_run_step(&(tstep){.n_acc = 2, .acc = {DD, D2}, .acc_n = {2, 1}, .n_dec = 2, .dec = {DD, D2}}); /* D 163, D2 162 */
    lh_run_step(&(tstep){.n_dec = 2, .dec = {DD, D2}});                                                /* D 164, D2 163 */
    lh_run_step(&(tstep){.n_dec = 2, .dec = {D2, DD}});                                                /* D2 164, D 165 */
    compare_positions("kept draft tokens 160-161 of D (S = 3, n_acc 2) vs D2 one at a time", DD, 160, D2, 160, 2,
                      BAR_CP, K_SCENARIO);
    compare_positions("D after keeping 2 of 3 (tokens 162-163) vs D2 running only those", DD, 162, D2, 162, 2, BAR_CP,
                      K_SCENARIO);
    lh_run_step(&(tstep){.n_dec = 1, .dec = {D2}}); /* D2 165: both hold 165 tokens */
    compare_positions("D2 tokens 163-164 after keeping 1 of 3 vs D", D2, 163, DD, 163, 2, BAR_CP, K_SCENARIO);
    compare_states("D vs D2 after the same 165 tokens through different draft acceptances", DD, D2, BAR_CP,
                   K_SCENARIO);
    if (g_rank == 0)
        printf("draft tokens: keeping n_acc of S = 3 == running only those tokens: checked (steps 6-10)\n");
}

/* ---- generation: greedy tokens through the tied LM head ------------------------------------ */
static gdp_model_weights g_model;
static double g_norm_eps;
static char g_path[256]; /* the test's checkpoint */

/* Logits of one final hidden row: the final RMSNorm, then the tied embedding as the LM head. */
static void logits_of(const float *row, double *logits) {
    const float *emb = g_model.embedding.data, *fw = g_model.final_norm_weight.data;
    double ss = 0, h[D_MODEL];
    for (int d = 0; d < D_MODEL; d++)
        ss += (double)row[d] * row[d];
    const double rstd = 1.0 / sqrt(ss / D_MODEL + g_norm_eps);
    for (int d = 0; d < D_MODEL; d++)
        h[d] = row[d] * rstd * fw[d];
    for (int v = 0; v < VOCAB; v++) {
        double acc = 0;
        for (int d = 0; d < D_MODEL; d++)
            acc += h[d] * emb[v * D_MODEL + d];
        logits[v] = acc;
    }
}

/* argmax and the margin to the runner-up. */
static int32_t greedy(const double *logits, double *margin) {
    int32_t best = 0, second = -1;
    for (int32_t v = 1; v < VOCAB; v++)
        if (logits[v] > logits[best])
            best = v;
    for (int32_t v = 0; v < VOCAB; v++)
        if (v != best && (second < 0 || logits[v] > logits[second]))
            second = v;
    *margin = logits[best] - logits[second];
    return best;
}

static void embed(int32_t token, float *row) {
    memcpy(row, (const float *)g_model.embedding.data + (size_t)token * D_MODEL, sizeof(float) * D_MODEL);
}

static void scenario_generate(void) {
    const int32_t reqs[3] = {G0, G1, G2}, prompt_len[3] = {37, 5, 90};
    int32_t *prompt[3];
    for (int32_t i = 0; i < 3; i++) {
        g_req[reqs[i]] = (request){.seed = 20 + i};
        prompt[i] = malloc(sizeof(int32_t) * (size_t)prompt_len[i]);
        test_rng r;
        test_rng_seed(&r, 4242u + (uint64_t)i);
        for (int32_t k = 0; k < prompt_len[i]; k++)
            prompt[i][k] = (int32_t)(test_uniform(&r) * VOCAB) % VOCAB;
    }
    /* tokens[k][i][s]: stack k's generated token s of request i; the comparison's state */
    int32_t tokens[MAX_STACKS][3][GEN_STEPS + 1];
    bool agreeing[3] = {true, true, true};
    int32_t compared = 0, free_after = 0;
    double logits[MAX_STACKS][VOCAB], margin[MAX_STACKS], logit_worst = 0;
    for (int32_t step = 0; step <= GEN_STEPS; step++) {
        tstep t;
        memset(&t, 0, sizeof t);
        if (step == 0) {
            t = (tstep){.n_rel = 2, .rel = {DD, D2}, .n_pre = 3, .pre = {G0, G1, G2},
                        .tokens = {prompt_len[0], prompt_len[1], prompt_len[2]}, .flags = {NEW, NEW, NEW}};
        } else {
            t = (tstep){.n_dec = 3, .dec = {G0, G1, G2}};
        }
        g_job.step_no++;
        int32_t dec_slots[4], rel_slots[8];
        gdp_prefill_request pre[4];
        gdp_draft_accept acc[4];
        const gdp_step_desc d = lh_make_desc(&t, g_req, dec_slots, rel_slots, pre, acc);
        const gdp_step_metadata *ms[MAX_STACKS] = {NULL};
        lh_prepare_all(&t, &d, ms);
        const gdp_step_metadata *m = ms[0];
        const int64_t T = m->padded_token_count;
        if (step > 0)
            CHECK(T == 4 && m->padded_decode_count == 4, "generation step %d: bucket of %lld rows, pd %d (want the "
                  "4-row decode bucket: 4/cp requests per CP rank)", step, (long long)T, m->padded_decode_count);
        int32_t *tag_req = malloc(sizeof(int32_t) * (size_t)T), *tag_pos = malloc(sizeof(int32_t) * (size_t)T);
        lh_tag_rows(&t, m, tag_req, tag_pos);
        /* Every stack is fed the reference's tokens: identical to each stack's own while the
         * tokens agree, and after a near-tie (no claim on tokens) the layers, states and logits
         * still compare on identical inputs. */
        float *x = malloc(sizeof(float) * (size_t)(T * D_MODEL)), *finals[MAX_STACKS];
        int64_t last_row[3];
        for (int64_t row = 0; row < T; row++)
            token_row(800000 + g_job.step_no, (int32_t)row, x + row * D_MODEL); /* padding */
        for (int32_t i = 0; i < 3; i++) {
            if (step == 0) {
                const int64_t first = m->prefill_token_offset + m->host.cu_seqlens[i];
                for (int32_t p = 0; p < prompt_len[i]; p++)
                    embed(prompt[i][p], x + (first + p) * D_MODEL);
                last_row[i] = first + prompt_len[i] - 1;
            } else {
                embed(tokens[1][i][step - 1], x + (int64_t)i * D_MODEL);
                last_row[i] = i;
            }
        }
        for (int k = 0; k < g_job.n_stacks; k++)
            finals[k] = malloc(sizeof(float) * (size_t)(T * D_MODEL));
        float *xs[MAX_STACKS] = {x, x, x};
        lh_forward_all(ms, xs, tag_req, tag_pos, finals);
        lh_finish_step(&t, d.decode_tokens);
        for (int32_t i = 0; i < 3; i++) {
            for (int k = 0; k < g_job.n_stacks; k++) {
                logits_of(finals[k] + last_row[i] * D_MODEL, logits[k]);
                tokens[k][i][step] = greedy(logits[k], &margin[k]);
            }
            /* The logit bar, relative to the reference's largest logit: CPU, the layer bar
             * (1e-5); GPU, Megatron's 5e-2. */
            double mb = 0;
            for (int32_t v = 0; v < VOCAB; v++)
                mb = fabs(logits[1][v]) > mb ? fabs(logits[1][v]) : mb;
            const double bar = (g_cuda ? GPU_BAR_LOGITS : BAR_CP) * mb;
            char what[96];
            snprintf(what, sizeof what, "generation step %d: request %d logits, cp stack vs tp 1 cp 1", step, i);
            check_close(what, logits[0], logits[1], VOCAB, BAR_CP, GPU_BAR_LOGITS, K_LOGITS);
            logit_worst = g_job.worst[K_LOGITS];
            if (!agreeing[i])
                continue;
            compared++;
            if (tokens[0][i][step] != tokens[1][i][step]) {
                /* Runs that sum in different orders may split a near-tie: no claim from here on. */
                CHECK(margin[0] < bar || margin[1] < bar,
                      "generation step %d: request %d tokens %d vs %d with top-2 margins %.3e and %.3e, both above "
                      "the logit bar %.1e",
                      step, i, tokens[0][i][step], tokens[1][i][step], margin[0], margin[1], bar);
                agreeing[i] = false;
                free_after++;
            } else if (margin[0] < bar || margin[1] < bar) {
                agreeing[i] = false; /* the same token, but the next ones carry no claim either */
                free_after++;
            }
            if (g_cuda && tokens[1][i][step] != tokens[2][i][step] && margin[1] >= bar && margin[2] >= bar)
                CHECK(false, "generation step %d: request %d GPU vs CPU reference tokens %d vs %d, margins %.3e %.3e",
                      step, i, tokens[1][i][step], tokens[2][i][step], margin[1], margin[2]);
        }
        for (int k = 0; k < g_job.n_stacks; k++)
            free(finals[k]);
        free(x), free(tag_req), free(tag_pos);
    }
    if (g_rank == 0) {
        printf("generation (prompts 37, 5, 90; %d greedy decode steps, requests sharded over cp = %d):\n", GEN_STEPS,
               g_cp);
        for (int32_t i = 0; i < 3; i++) {
            printf("  request %d tokens:", i);
            for (int32_t s = 0; s <= GEN_STEPS; s++)
                printf(" %d", tokens[0][i][s]);
            printf("%s\n", agreeing[i] ? " (identical to tp 1 cp 1)" : " (a near-tie ended the claim)");
        }
        printf("  %d token comparisons, %d ended by a margin below the logit bar; worst logits %s %.2e\n", compared,
               free_after, g_cuda ? "rel RMS" : "max|a-b|/max|b|", logit_worst);
    }
    for (int32_t i = 0; i < 3; i++)
        free(prompt[i]);
}

/* ---- the serving engine (gdp-run) with CP ---------------------------------------------------- */

/* gdp-run's engine over a CP model (gdp_model_init_cp; the engine's comm is the whole job)
 * vs a tp 1 cp 1 engine on every rank, on one synthetic workload with draft tokens and
 * preemption (4 slots for 8 requests): the generated tokens must be identical up to the first
 * token whose top-2 margin, in either run, is below the logit bar (gdp-math.md 8.1). */
static void scenario_engine(void) {
    gdp_checkpoint_t ck = NULL;
    GDP_FATAL_IF_ERROR(g_world, gdp_checkpoint_open(&ck, g_path));
    gdp_model_t cpm = NULL, refm = NULL;
    GDP_FATAL_IF_ERROR(g_world, gdp_model_init_cp(&cpm, g_ctx, g_tp_comm, g_cp_comm, ck));
    GDP_FATAL_IF_ERROR(g_world, gdp_model_init(&refm, g_ctx, NULL, ck));
    gdp_cp_shard ms;
    CHECK_OK(gdp_model_get_cp_shard(cpm, &ms));
    CHECK(ms.cp_size == g_cp && ms.cp_rank == g_cp_rank && ms.tp.tp_rank == g_tp_rank,
          "the model's CP shard is cp rank %d of %d, tp rank %d", ms.cp_rank, ms.cp_size, ms.tp.tp_rank);
    gdp_engine_config ec;
    gdp_engine_config_default(&ec);
    ec.n_slots = 4, ec.max_step_tokens = 192, ec.prefill_chunk = 128, ec.draft_tokens = 2, ec.preempt_after = 4;
    ec.preempt_wait_ms = 0; /* preempt as soon as a request waits: the test needs preemptions */
    ec.progress = 0, ec.honor_arrivals = 0;
    gdp_engine_t cpe = NULL, refe = NULL;
    GDP_FATAL_IF_ERROR(g_world, gdp_engine_init(&cpe, g_ctx, g_world, cpm, &ec));
    GDP_FATAL_IF_ERROR(g_world, gdp_engine_init(&refe, g_ctx, NULL, refm, &ec));
    gdp_synthetic_workload sp;
    gdp_workload_synthetic_default(&sp);
    sp.n_requests = 8, sp.rate = 0, sp.prompt_min = 20, sp.prompt_max = 150, sp.new_min = sp.new_max = 10;
    sp.seed = 5;
    gdp_workload wl;
    memset(&wl, 0, sizeof wl);
    GDP_FATAL_IF_ERROR(g_world, gdp_workload_synthetic(&wl, &sp, VOCAB));
    GDP_FATAL_IF_ERROR(g_world, gdp_engine_run(cpe, g_rank == 0 ? &wl : NULL));
    GDP_FATAL_IF_ERROR(g_world, gdp_engine_run(refe, &wl));
    gdp_engine_report rep;
    CHECK_OK(gdp_engine_get_report(cpe, &rep));
    CHECK(rep.tp_size == g_tp, "the CP engine reports tp %d, expected %d", rep.tp_size, g_tp);
    if (g_rank == 0) {
        int64_t same = 0, total = 0, ended = 0;
        for (int32_t i = 0; i < wl.n_requests; i++) {
            gdp_request_result a, b;
            CHECK_OK(gdp_engine_get_result(cpe, i, &a));
            CHECK_OK(gdp_engine_get_result(refe, i, &b));
            CHECK(a.n_generated == b.n_generated && a.n_generated == sp.new_max, "request %d: %d vs %d tokens", i,
                  a.n_generated, b.n_generated);
            total += b.n_generated;
            for (int32_t t = 0; t < a.n_generated && t < b.n_generated; t++) {
                /* CPU: the layer bar on the logits; GPU: Megatron's 5e-2 */
                const double bar_a = (g_cuda ? GPU_BAR_LOGITS : BAR_CP) * a.logit_scale[t];
                const double bar_b = (g_cuda ? GPU_BAR_LOGITS : BAR_CP) * b.logit_scale[t];
                const bool near_tie = a.margin[t] < bar_a || b.margin[t] < bar_b;
                if (a.tokens[t] != b.tokens[t])
                    CHECK(near_tie, "engine request %d token %d: %d vs %d with margins %.3e and %.3e above the bar",
                          i, t, a.tokens[t], b.tokens[t], a.margin[t], b.margin[t]);
                if (a.tokens[t] != b.tokens[t] || near_tie) {
                    ended++;
                    break;
                }
                same++;
            }
        }
        printf("engine (gdp-run) with cp = %d, drafts 2, 4 slots for 8 requests (%lld preemptions): %lld of %lld "
               "generated tokens identical to tp 1 cp 1 before any near-tie (%lld requests ended by one)\n",
               g_cp, (long long)rep.preemptions, (long long)same, (long long)total, (long long)ended);
    }
    CHECK_OK(gdp_engine_free(cpe));
    CHECK_OK(gdp_engine_free(refe));
    CHECK_OK(gdp_model_free(cpm));
    CHECK_OK(gdp_model_free(refm));
    gdp_workload_free(&wl);
    gdp_checkpoint_free(ck);
}

/* ---- bad input: an error on every rank, nothing modified --------------------------------- */

static void write_checkpoint(const char *path, int64_t H, int64_t G) {
    gdp_layer_config cfg;
    gdp_layer_config_default(&cfg);
    cfg.hidden_size = D_MODEL, cfg.num_heads = H, cfg.num_groups = G, cfg.head_dim = 16, cfg.state_dim = 16;
    cfg.num_householder = 2, cfg.num_layers = LAYERS, cfg.vocab_size = VOCAB;
    if (g_rank == 0)
        GDP_FATAL_IF_ERROR(g_world, gdp_checkpoint_write_synthetic(path, &cfg, 1234, GDP_DTYPE_FP32));
    MPI_Barrier(MPI_COMM_WORLD);
}

static void scenario_bad_input(const char *bad_path) {
    /* a step in flight: G0 decodes one token; x of the wrong shape (one row too many for this
     * rank's block), metadata built but not applied */
    lh_refusal r;
    lh_refusal_begin(&r, &g_cps, g_req[G0].slot);
    lh_refuse_shape_and_unapplied(&r);
    char want[96];

    /* a cache sized for the TP shard (every TP-local head) instead of the CP shard's */
    if (g_cp > 1) {
        gdp_cache_config cc;
        gdp_cache_t tp_cache = NULL;
        gdp_plan_t local_plan = NULL;
        CHECK_OK(gdp_cache_config_init(&cc, &g_cps_shard.tp, N_SLOTS));
        CHECK_OK(gdp_cache_init(&tp_cache, g_ctx, &cc));
        gdp_plan_config pc = {.num_householder = g_cps_shard.tp.config.num_householder, .n_slots = N_SLOTS,
                              .max_decode_tokens = 1, .n_buckets = N_BUCKETS, .buckets = k_buckets};
        CHECK_OK(gdp_plan_init(&local_plan, g_ctx, &pc));
        const gdp_prefill_request one = {.slot = GDP_SLOT_AUTO, .n_tokens = 3, .flags = GDP_PREFILL_NEW};
        const gdp_step_desc pd = {.prefill_count = 1, .prefill = &one, .bucket = GDP_BUCKET_AUTO};
        const gdp_step_metadata *mt = NULL;
        CHECK_OK(gdp_plan_bcast(local_plan, NULL, 0, &pd));
        CHECK_OK(gdp_plan_build(local_plan, tp_cache, NULL, &mt));
        CHECK_OK(gdp_cache_apply_step(tp_cache, mt));
        int64_t f2, c2;
        lh_local_rows(&g_cps, mt->padded_token_count, &f2, &c2);
        const size_t b2 = sizeof(float) * (size_t)(c2 * D_MODEL);
        void *x2 = g_cps.gpu ? dev_alloc(b2) : calloc((size_t)(c2 * D_MODEL), sizeof(float));
        lh_check_refused(&g_cps, tp_cache, mt, x2, c2, GDP_STATUS_INVALID_ARGUMENT, "gdp_cache_config_init_cp");
        if (g_cps.gpu)
            dev_free(x2);
        else
            free(x2);
        CHECK_OK(gdp_plan_free(local_plan));
        CHECK_OK(gdp_cache_free(tp_cache));
        lh_refusal_unchanged(&r, "a cache of the TP shard");
    }

    /* rows that do not split over cp: gdp_plan_check_token_split names the bucket, the layer
     * refuses a step padded to it */
    const int32_t split = g_sp ? g_tp * g_cp : g_cp;
    if (split > 1) {
        CHECK_STATUS(gdp_plan_check_token_split(g_cps.plan, split), GDP_STATUS_INVALID_ARGUMENT);
        snprintf(want, sizeof want, "bucket %d has %d token rows", ODD_BUCKET, ODD_ROWS);
        CHECK(strstr(gdp_last_error(), want) != NULL, "rank %d: message '%s' lacks '%s'", g_rank, gdp_last_error(),
              want);
        gdp_step_desc d = r.d;
        d.bucket = ODD_BUCKET;
        const gdp_step_metadata *m = lh_stack_prepare(&g_cps, &d);
        const int64_t odd_rows = ODD_ROWS / split;
        const size_t odd_bytes = sizeof(float) * (size_t)(odd_rows * D_MODEL);
        void *odd = g_cps.gpu ? dev_alloc(odd_bytes) : calloc((size_t)(odd_rows * D_MODEL), sizeof(float));
        snprintf(want, sizeof want, "%d token rows over cp = %d", ODD_ROWS, g_cp);
        lh_check_refused(&g_cps, g_cps.cache, m, odd, odd_rows, GDP_STATUS_INVALID_ARGUMENT, want);
        if (g_cps.gpu)
            dev_free(odd);
        else
            free(odd);
        lh_refusal_unchanged(&r, "rows that do not split");
    }
    int32_t without_odd = 0;
    for (int32_t b = 0; b < N_BUCKETS; b++)
        without_odd += k_buckets[b].token_count % split != 0 && b != ODD_BUCKET;
    CHECK(without_odd == 0, "the test's own buckets other than %d must split over %d ranks", ODD_BUCKET, split);

    /* a checkpoint whose G/tp breaks the group rule (G/tp = 3 groups over cp = 2 or 4) */
    if (g_cp > 1) {
        gdp_checkpoint_t ck = NULL;
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        CHECK_OK(gdp_checkpoint_open(&ck, bad_path));
        CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w, 0, g_tp_rank, g_tp));
        gdp_layer_t bad = (gdp_layer_t)&w;
        CHECK_STATUS(gdp_layer_init_cp(&bad, g_ctx, g_tp_comm, g_cp_comm, &w, g_cps.mode),
                     GDP_STATUS_INVALID_ARGUMENT);
        CHECK(bad == NULL, "*out not reset by a failing gdp_layer_init_cp");
        snprintf(want, sizeof want, "cp_size = %d", g_cp);
        CHECK(strstr(gdp_last_error(), want) != NULL && strstr(gdp_last_error(), "G/tp = 3") != NULL,
              "rank %d: message '%s' lacks '%s' and 'G/tp = 3'", g_rank, gdp_last_error(), want);
        gdp_layer_weights_free(&w);
        gdp_checkpoint_free(ck);
    }
    /* another TP rank's weights */
    if (g_tp > 1) {
        gdp_checkpoint_t ck = NULL;
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        CHECK_OK(gdp_checkpoint_open(&ck, g_path));
        CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w, 0, (g_tp_rank + 1) % g_tp, g_tp));
        gdp_layer_t bad = (gdp_layer_t)&w;
        CHECK_STATUS(gdp_layer_init_cp(&bad, g_ctx, g_tp_comm, g_cp_comm, &w, g_cps.mode),
                     GDP_STATUS_INVALID_ARGUMENT);
        snprintf(want, sizeof want, "tp rank %d of %d", (g_tp_rank + 1) % g_tp, g_tp);
        CHECK(strstr(gdp_last_error(), want) != NULL, "rank %d: message '%s' lacks '%s'", g_rank, gdp_last_error(),
              want);
        gdp_layer_weights_free(&w);
        gdp_checkpoint_free(ck);
    }
    lh_refusal_end(&r);
    if (g_rank == 0)
        printf("bad input: wrong x shape%s, unapplied metadata%s%s%s refused on every rank, nothing modified\n",
               g_cp > 1 ? ", a cache of the TP shard" : "", split > 1 ? ", rows that do not split over cp" : "",
               g_cp > 1 ? ", G/tp = 3 over cp" : "", g_tp > 1 ? ", another TP rank's weights" : "");
}

/* --backend cuda: 1 when this rank can run the test (a CUDA build and a visible GPU). */
static int gpu_usable(char *why, size_t n) {
    int count = 0;
    return test_gpu_usable(why, n, &count);
}

static void usage_fatal(const char *arg) {
    GDP_FATAL(NULL, "test_layer_cp: bad argument '%s'; usage: test_layer_cp [--tp T] [--sp] [--groups G] "
              "[--backend cpu|cuda] (cp = ranks / T)", arg);
}

int main(int argc, char **argv) {
    lh_mpi_init(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        if (lh_common_arg(argc, argv, &i))
            continue;
        if (!strcmp(argv[i], "--tp") && i + 1 < argc)
            g_tp = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--groups") && i + 1 < argc)
            g_groups = atoi(argv[++i]);
        else
            usage_fatal(argv[i]);
    }
    if (gdp_parallel_ranks(g_rank, g_size, g_tp, &g_tp_rank, &g_cp_rank, &g_cp) != GDP_STATUS_SUCCESS)
        usage_fatal(gdp_last_error());
    char name[64];
    snprintf(name, sizeof name, "test_layer_cp%s%s", g_cuda ? "_gpu" : "", g_sp ? "_sp" : "");
    if (lh_skip_without_gpu(name, gpu_usable))
        return TEST_SKIP;
    /* The job's comm (the plan's host agreements, the engine's collectives), then the TP
     * groups (ranks with the same cp_rank, ordered by tp_rank) and the CP groups (the same
     * tp_rank, ordered by cp_rank). The ctx takes the job comm's GPU (each sub-comm binds one
     * by its own node-local rank; the MPI comm stages through the host from any GPU). */
    const gdp_comm_buffers_t buffers = g_cuda ? GDP_COMM_DEVICE_BUFFERS : GDP_COMM_HOST_BUFFERS;
    GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&g_world, GDP_COMM_MPI, NULL, buffers));
    lh_fatal_comm = g_world;
    MPI_Comm tp_mpi, cp_mpi;
    MPI_Comm_split(MPI_COMM_WORLD, g_cp_rank, g_tp_rank, &tp_mpi);
    MPI_Comm_split(MPI_COMM_WORLD, g_tp_rank, g_cp_rank, &cp_mpi);
    if (g_tp > 1)
        GDP_FATAL_IF_ERROR(g_world, gdp_comm_init(&g_tp_comm, GDP_COMM_MPI, &tp_mpi, buffers));
    GDP_FATAL_IF_ERROR(g_world, gdp_comm_init(&g_cp_comm, GDP_COMM_MPI, &cp_mpi, buffers));
    int32_t r = -1;
    GDP_FATAL_IF_ERROR(g_world, gdp_comm_rank(g_cp_comm, &r));
    CHECK(r == g_cp_rank, "the CP comm's rank %d is not cp_rank %d", r, g_cp_rank);
    lh_ctx_init(g_world);

    /* the checkpoints, written by rank 0: the test's (H = 8, G = --groups) and one whose
     * G/tp = 3 groups no cp > 1 of this job can split or share (H/tp = 3 cp heads divide) */
    long job = (long)getpid();
    MPI_Bcast(&job, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char bad_path[256];
    snprintf(g_path, sizeof g_path, "%s/gdp_test_layer_cp_%ld.safetensors", tmp, job);
    snprintf(bad_path, sizeof bad_path, "%s/gdp_test_layer_cp_bad_%ld.safetensors", tmp, job);
    write_checkpoint(g_path, HEADS, g_groups);
    write_checkpoint(bad_path, 3 * (int64_t)g_tp * g_cp, 3 * (int64_t)g_tp);
    {
        gdp_checkpoint_t ck = NULL;
        gdp_layer_config cfg;
        GDP_FATAL_IF_ERROR(g_world, gdp_checkpoint_open(&ck, g_path));
        GDP_FATAL_IF_ERROR(g_world, gdp_checkpoint_get_config(ck, &cfg));
        GDP_FATAL_IF_ERROR(g_world, gdp_checkpoint_load_model_weights(ck, &g_model));
        gdp_checkpoint_free(ck);
        g_norm_eps = cfg.norm_eps;
    }
    const gdp_tp_mode_t mode = g_sp ? GDP_TP_MODE_SEQUENCE_PARALLEL : GDP_TP_MODE_ALLREDUCE;
    stack_init(&g_cps, "cp", g_path, g_ctx, true, mode);
    stack_init(&g_ref, "tp1 cp1", g_path, g_ctx, false, GDP_TP_MODE_ALLREDUCE);
    if (g_cuda)
        stack_init(&g_cref, "cpu tp1 cp1", g_path, g_cpu_ctx, false, GDP_TP_MODE_ALLREDUCE);
    if (g_rank == 0)
        printf("# gdp layer stack: %d layers, D=%d H=%d G=%lld P=16 N=16 M=2, tp %d x cp %d (%s) vs tp 1 cp 1, %s "
               "backend%s; core per rank: H_c=%lld G_c=%lld (groups %s)\n",
               LAYERS, D_MODEL, HEADS, (long long)g_groups, g_tp, g_cp, gdp_tp_mode_name(mode),
               g_cuda ? "CUDA" : "CPU", g_cuda ? " (and CPU tp 1)" : "", (long long)g_cps_shard.num_heads,
               (long long)g_cps_shard.num_groups,
               g_cps_shard.group_repeat > 1 ? "replicated: G/tp < cp" : "split: G/tp >= cp");
    g_a = malloc(sizeof(double) * SCRATCH);
    g_b = malloc(sizeof(double) * SCRATCH);
    g_job = (lh_job){.stacks = {&g_cps, &g_ref, &g_cref}, .n_stacks = g_cuda ? 3 : 2, .reqs = g_req, .n_reqs = NREQ,
                     .bar = BAR_CP, .print_every_rank = false};
    snprintf(g_job.vs, sizeof g_job.vs, "tp %d x cp %d vs tp 1 cp 1", g_tp, g_cp);

    scenario_arithmetic();
    lh_scenario_chunked_and_decode();
    if (g_rank == 0)
        printf("uneven varlen packs over the CP ranks, chunked prefill == one prefill, decode == recompute: checked "
               "(steps 1-3)\n");
    lh_scenario_prefix();
    if (g_rank == 0)
        printf("prefix snapshot restore + continue == uninterrupted: checked (steps 4-5)\n");
    scenario_drafts();
    scenario_generate();
    scenario_engine();
    scenario_bad_input(bad_path);

    gdp_model_weights_free(&g_model);
    double worst[K_KINDS];
    lh_job_end(worst);
    if (g_rank == 0)
        remove(g_path), remove(bad_path);
    if (g_rank == 0) {
        printf("# worst %s: cp vs tp1 cp1 outputs %.2e, states %.2e, logits %.2e; chunked/restore/drafts %.2e, "
               "decode vs recompute %.2e\n",
               g_cuda ? "relative RMS" : "max|a-b|/max|b|", worst[K_OUT], worst[K_STATE], worst[K_LOGITS],
               worst[K_SCENARIO], worst[K_RECOMPUTE]);
        if (g_cuda)
            printf("# worst relative RMS, GPU tp 1 vs CPU tp 1: outputs %.2e, states %.2e\n", worst[K_CPU_OUT],
                   worst[K_CPU_STATE]);
    }
    lh_ctx_free();
    CHECK_OK(gdp_comm_free(g_cp_comm));
    CHECK_OK(gdp_comm_free(g_tp_comm));
    MPI_Comm_free(&tp_mpi);
    MPI_Comm_free(&cp_mpi);
    CHECK_OK(gdp_comm_free(g_world));
    return lh_finish(name);
}
