/*
 * layer_harness.c: the shared harness of the multi-rank layer tests (test_layer_tp.c,
 * test_layer_cp.c; see layer_harness.h): job set-up, options, skip and summary, device memory,
 * the stacks and their step driver, the request table's step description, token rows, the delta
 * record, the backend's comparison bar, the shared scenarios and the refused-forward fixture.
 */
#include "layer_harness.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int g_rank = 0, g_size = 1;
bool g_sp = false;
bool g_cuda = false;
gdp_ctx_t g_ctx;
gdp_ctx_t g_cpu_ctx;
gdp_comm_t lh_fatal_comm;
double g_rec[MAX_STACKS][LH_MAX_REQ][MAXPOS][LAYERS][D_MODEL];
bool g_have[LH_MAX_REQ][MAXPOS];
double *g_a, *g_b;

/* ---- device memory ------------------------------------------------------------------------ */
#ifdef GDP_HAVE_CUDA
void *g_stream;
void *dev_alloc(size_t bytes) {
    void *p = NULL;
    LH_CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}
void dev_free(void *p) { LH_CUDA_OK(cudaFree(p)); }
/* Both copies run on the ctx's stream, in order with the layers' work, and then wait for it.
 * A plain cudaMemcpy would run on the legacy default stream, which the ctx's non-blocking
 * stream never waits for; and from pageable memory it returns once the bytes are staged,
 * before the DMA has landed, so the next forward could read x while it is still arriving
 * (issue 12: the GPU stack disagreed with the CPU one from some step on, in some runs). */
void dev_upload(void *dst, const void *src, size_t bytes) {
    LH_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)g_stream));
    LH_CUDA_OK(cudaStreamSynchronize((cudaStream_t)g_stream)); /* src is pageable and rewritten next */
}
void dev_download(void *dst, const void *src, size_t bytes) {
    LH_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)g_stream));
    LH_CUDA_OK(cudaStreamSynchronize((cudaStream_t)g_stream)); /* the host reads dst next */
}
#else
/* Never reached: without CUDA the --backend cuda run is skipped before any stack exists. */
void *dev_alloc(size_t bytes) { GDP_FATAL(lh_fatal_comm, "no CUDA in this build (%zu bytes)", bytes); }
void dev_free(void *p) { (void)p; }
void dev_upload(void *dst, const void *src, size_t bytes) { GDP_FATAL(lh_fatal_comm, "no CUDA in this build"); }
void dev_download(void *dst, const void *src, size_t bytes) { GDP_FATAL(lh_fatal_comm, "no CUDA in this build"); }
#endif

void lh_read_floats(bool gpu, const void *base, int64_t offset, int64_t n, double *out) {
    const float *src = (const float *)base + offset;
    float *tmp = NULL;
    if (gpu) {
        tmp = malloc(sizeof(float) * (size_t)n);
        dev_download(tmp, src, sizeof(float) * (size_t)n);
        src = tmp;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = src[i];
    free(tmp);
}

/* ---- the job ------------------------------------------------------------------------------ */
void lh_ctx_init(gdp_comm_t device_comm) {
    if (g_cuda) {
#ifdef GDP_HAVE_CUDA
        int32_t device = 0;
        GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_comm_device(device_comm, &device));
        GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_ctx_init(&g_ctx, GDP_BACKEND_CUDA, device));
        cudaStream_t stream = NULL;
        LH_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        g_stream = stream;
        GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_ctx_set_stream(g_ctx, g_stream));
        GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_ctx_init(&g_cpu_ctx, GDP_BACKEND_CPU, 0));
#else
        (void)device_comm;
#endif
    } else {
        GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_ctx_init(&g_ctx, GDP_BACKEND_CPU, 0));
    }
}

void lh_ctx_free(void) {
    CHECK_OK(gdp_ctx_free(g_ctx));
    if (g_cuda) {
        CHECK_OK(gdp_ctx_free(g_cpu_ctx));
#ifdef GDP_HAVE_CUDA
        LH_CUDA_OK(cudaStreamDestroy((cudaStream_t)g_stream));
#endif
    }
}

void lh_mpi_init(int *argc, char ***argv) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
}

bool lh_common_arg(int argc, char **argv, int *i) {
    const char *a = argv[*i], *value = *i + 1 < argc ? argv[*i + 1] : "";
    if (!strcmp(a, "--sp"))
        g_sp = true;
    else if (!strcmp(a, "--backend") && (!strcmp(value, "cuda") || !strcmp(value, "cpu")))
        g_cuda = !strcmp(value, "cuda"), (*i)++;
    else
        return false;
    return true;
}

bool lh_skip_without_gpu(const char *name, int (*usable)(char *why, size_t n)) {
    if (!g_cuda)
        return false;
    char why[160] = "";
    const int ok = usable(why, sizeof why);
    if (test_gpu_all_ranks_usable(ok, name, why))
        return false;
    MPI_Finalize();
    return true;
}

int lh_finish(const char *name) {
    int failures = 0;
    MPI_Allreduce(&g_test_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("# failures over %d ranks : %d %s\n", g_size, failures, failures ? "FAILED" : "OK");
    if (g_rank == 0 || g_test_failures)
        test_finish(name);
    MPI_Finalize();
    return failures ? 1 : 0;
}

/* ---- the scheduled requests --------------------------------------------------------------- */
gdp_step_desc lh_make_desc(const tstep *t, request *reqs, int32_t *dec_slots, int32_t *rel_slots,
                           gdp_prefill_request *pre, gdp_draft_accept *acc) {
    for (int32_t i = 0; i < t->n_acc; i++) {
        request *r = &reqs[t->acc[i]];
        acc[i] = (gdp_draft_accept){.slot = r->slot, .n_accepted = t->acc_n[i]};
        r->pos = r->draft_base + t->acc_n[i];
    }
    for (int32_t i = 0; i < t->n_rel; i++)
        rel_slots[i] = reqs[t->rel[i]].slot;
    for (int32_t i = 0; i < t->n_dec; i++)
        dec_slots[i] = reqs[t->dec[i]].slot;
    for (int32_t i = 0; i < t->n_pre; i++) {
        const request *r = &reqs[t->pre[i]];
        const bool is_new = (t->flags[i] & GDP_PREFILL_NEW) != 0;
        pre[i] = (gdp_prefill_request){.slot = is_new ? GDP_SLOT_AUTO : r->slot, .n_tokens = t->tokens[i],
                                       .flags = t->flags[i], .restore_snapshot = t->restore[i],
                                       .save_snapshot = t->save[i], .save_offset = t->save_off[i]};
    }
    const int32_t S = t->S ? t->S : 1;
    return (gdp_step_desc){.decode_count = t->n_dec, .decode_tokens = S, .decode_slots = dec_slots,
                           .prefill_count = t->n_pre, .prefill = pre, .release_count = t->n_rel,
                           .release_slots = rel_slots, .accept_count = t->n_acc, .accept = acc,
                           .bucket = t->bucket ? t->bucket - 1 : GDP_BUCKET_AUTO};
}

/* Checks every stack built the same step (bucket, metadata bytes, slots; names[k]: stack k's
 * name), then gives the new requests their slots and marks released ones dead. */
static void agree_on_step(const tstep *t, const gdp_step_metadata *const ms[MAX_STACKS], int n_stacks,
                          const char *const names[MAX_STACKS], int32_t step_no, request *reqs) {
    for (int k = 1; k < n_stacks; k++) {
        /* Every stack built the same step against the same slot state: the same bytes. */
        CHECK(ms[k]->bucket == ms[0]->bucket, "step %d: buckets %d vs %d", step_no, ms[k]->bucket, ms[0]->bucket);
        CHECK(ms[k]->buffer_bytes == ms[0]->buffer_bytes &&
                  !memcmp(ms[k]->host_buffer, ms[0]->host_buffer, ms[0]->buffer_bytes),
              "step %d: the metadata of stack %s differs from stack %s's", step_no, names[k], names[0]);
        for (int32_t i = 0; i < t->n_pre; i++)
            CHECK(ms[0]->step->prefill[i].slot == ms[k]->step->prefill[i].slot, "step %d: request %d slots %d vs %d",
                  step_no, t->pre[i], ms[0]->step->prefill[i].slot, ms[k]->step->prefill[i].slot);
    }
    for (int32_t i = 0; i < t->n_pre; i++) {
        reqs[t->pre[i]].slot = ms[0]->step->prefill[i].slot;
        reqs[t->pre[i]].live = 1;
    }
    for (int32_t i = 0; i < t->n_rel; i++)
        reqs[t->rel[i]].live = 0;
}

/* Moves the positions of the step's requests on (decodes by S, remembering the draft base). */
static void advance_positions(const tstep *t, int32_t S, request *reqs) {
    for (int32_t i = 0; i < t->n_dec; i++) {
        reqs[t->dec[i]].draft_base = reqs[t->dec[i]].pos;
        reqs[t->dec[i]].pos += S;
    }
    for (int32_t i = 0; i < t->n_pre; i++)
        reqs[t->pre[i]].pos += t->tokens[i];
}

void token_row(int32_t seed, int32_t pos, float *row) {
    test_rng r;
    test_rng_seed(&r, (uint64_t)seed * 1000003u + (uint64_t)pos);
    for (int d = 0; d < D_MODEL; d++)
        row[d] = (float)(TOKEN_SCALE * test_normal(&r));
}

/* Records each stack's layer deltas of a step's request rows (x_k = xs[k], outs[k][l] = x after
 * layer l); returns how many values of padding rows (tag_req < 0) changed. */
static int64_t record_deltas(int n_stacks, int64_t T, float *const xs[MAX_STACKS], float *outs[MAX_STACKS][LAYERS],
                             const int32_t *tag_req, const int32_t *tag_pos) {
    int64_t pad_changed = 0;
    for (int64_t row = 0; row < T; row++) {
        for (int k = 0; k < n_stacks; k++)
            for (int32_t l = 0; l < LAYERS; l++)
                for (int c = 0; c < D_MODEL; c++) {
                    const double in = l ? outs[k][l - 1][row * D_MODEL + c] : xs[k][row * D_MODEL + c];
                    const double delta = (double)outs[k][l][row * D_MODEL + c] - in;
                    if (tag_req[row] < 0)
                        pad_changed += delta != 0;
                    else
                        g_rec[k][tag_req[row]][tag_pos[row]][l][c] = delta;
                }
        if (tag_req[row] >= 0)
            g_have[tag_req[row]][tag_pos[row]] = true;
    }
    return pad_changed;
}

/* ---- comparisons -------------------------------------------------------------------------- */
/* The backend's bar (check_close); raises *worst to the ratio when larger (or NaN); returns
 * the ratio, the bar applied in *bar_out. */
static double bar_check(const char *what, const double *a, const double *b, int64_t n, double cpu_bar,
                        double gpu_bar, double *worst, double *bar_out) {
    double ratio, bar;
    if (g_cuda) {
        double bn = 0;
        for (int64_t i = 0; i < n; i++)
            bn += b[i] * b[i];
        ratio = test_rel_rms(a, b, n);
        bar = bn > 0 ? gpu_bar : 1e-6;
        CHECK(ratio <= bar, "rank %d: %s: relative RMS %.3e > %.0e (n = %lld)", g_rank, what, ratio, bar,
              (long long)n);
    } else {
        double md = 0, mb = 0;
        for (int64_t i = 0; i < n; i++) {
            const double e = fabs(a[i] - b[i]);
            md = e > md || isnan(e) ? e : md;
            mb = fabs(b[i]) > mb ? fabs(b[i]) : mb;
        }
        bar = cpu_bar;
        ratio = mb > 0 ? md / mb : md;
        CHECK(md <= bar * mb && mb > 0, "rank %d: %s: max|a-b| = %.3e > %.0e x max|b| = %.3e (n = %lld)", g_rank,
              what, md, bar, mb, (long long)n);
    }
    if (ratio > *worst || isnan(ratio))
        *worst = ratio;
    *bar_out = bar;
    return ratio;
}

/* Fills g_a, g_b with the recorded deltas of (ra, positions pa..) and (rb, pb..) in stack 0;
 * the count. */
static int64_t gather_positions(const char *what, int32_t ra, int32_t pa, int32_t rb, int32_t pb, int32_t n) {
    CHECK((int64_t)n * LAYERS * D_MODEL <= SCRATCH, "%s: %d positions overflow the scratch", what, n);
    int64_t k = 0;
    for (int32_t i = 0; i < n; i++) {
        CHECK(g_have[ra][pa + i] && g_have[rb][pb + i], "%s: position %d/%d not recorded", what, pa + i, pb + i);
        for (int32_t l = 0; l < LAYERS; l++)
            for (int d = 0; d < D_MODEL; d++, k++) {
                g_a[k] = g_rec[0][ra][pa + i][l][d];
                g_b[k] = g_rec[0][rb][pb + i][l][d];
            }
    }
    return k;
}

/* Fills g_a, g_b with the recorded deltas of every request row of this step in stacks sa and
 * sb; the count (0 when they overflow the scratch, a failed check). */
static int64_t gather_step_rows(const char *what, int sa, int sb, const int32_t *tag_req, const int32_t *tag_pos,
                                int64_t T) {
    int64_t n = 0;
    for (int64_t row = 0; row < T; row++) {
        if (tag_req[row] < 0)
            continue;
        CHECK(n + LAYERS * D_MODEL <= SCRATCH, "%s: %lld rows overflow the scratch", what, (long long)T);
        if (n + LAYERS * D_MODEL > SCRATCH)
            return 0;
        for (int32_t l = 0; l < LAYERS; l++)
            for (int c = 0; c < D_MODEL; c++, n++) {
                g_a[n] = g_rec[sa][tag_req[row]][tag_pos[row]][l][c];
                g_b[n] = g_rec[sb][tag_req[row]][tag_pos[row]][l][c];
            }
    }
    return n;
}

void check_close(const char *what, const double *a, const double *b, int64_t n, double cpu_bar, double gpu_bar,
                 int kind) {
    double bar;
    const double ratio = bar_check(what, a, b, n, cpu_bar, gpu_bar, &g_job.worst[kind], &bar);
    if (kind != K_SCENARIO && kind != K_RECOMPUTE)
        return;
    const char *measure = g_cuda ? "rel RMS" : "max|a-b|/max|b|";
    if (g_job.print_every_rank)
        printf("  rank %d %-78s %s = %.2e (bar %.0e)\n", g_rank, what, measure, ratio, bar);
    else if (g_rank == 0)
        printf("  %-84s %s = %.2e (bar %.0e)\n", what, measure, ratio, bar);
}

void compare_positions(const char *what, int32_t ra, int32_t pa, int32_t rb, int32_t pb, int32_t n, double bar,
                       int kind) {
    const int64_t k = gather_positions(what, ra, pa, rb, pb, n);
    check_close(what, g_a, g_b, k, bar, GPU_BAR_OUT, kind);
}

void compare_states(const char *what, int32_t qa, int32_t qb, double bar, int kind) {
    const int64_t n = lh_local_state(g_job.stacks[0], g_job.reqs[qa].slot, g_a);
    lh_local_state(g_job.stacks[0], g_job.reqs[qb].slot, g_b);
    check_close(what, g_a, g_b, n, bar, GPU_BAR_STATE, kind);
}

/* ---- a stack of layers with its cache and plan -------------------------------------------- */
lh_job g_job;

void lh_stack_begin(lh_stack *s, const char *name, gdp_ctx_t ctx, gdp_comm_t plan_comm, gdp_tp_mode_t mode) {
    memset(s, 0, sizeof *s);
    s->name = name;
    s->ctx = ctx;
    gdp_backend_t backend;
    GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_ctx_get_backend(ctx, &backend));
    s->gpu = backend == GDP_BACKEND_CUDA;
    s->plan_comm = plan_comm;
    s->mode = mode;
    s->row_blocks = 1, s->row_block = 0, s->row_owner = true;
}

void lh_stack_finish(lh_stack *s, gdp_cache_config *cc, int32_t num_householder, const gdp_step_bucket *buckets,
                     int32_t n_buckets, bool debug_check) {
    cc->max_draft_tokens = MAX_DRAFT;
    cc->n_snapshots = N_SNAPSHOTS;
    GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_cache_init(&s->cache, s->ctx, cc));
    gdp_plan_config pc = {.num_householder = num_householder, .n_slots = N_SLOTS, .max_decode_tokens = MAX_DRAFT,
                          .n_buckets = n_buckets, .buckets = buckets, .debug_check = debug_check};
    GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_plan_init(&s->plan, s->ctx, &pc));
}

void lh_stack_free(lh_stack *s) {
    for (int32_t l = 0; l < LAYERS; l++)
        CHECK_OK(gdp_layer_free(s->layers[l]));
    CHECK_OK(gdp_cache_free(s->cache));
    CHECK_OK(gdp_plan_free(s->plan));
}

const gdp_step_metadata *lh_stack_prepare(lh_stack *s, const gdp_step_desc *d) {
    const gdp_step_metadata *m = NULL;
    gdp_comm_t comm = s->plan_comm;
    GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_plan_bcast(s->plan, comm, 0, g_rank == 0 || !comm ? d : NULL));
    GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_plan_build(s->plan, s->cache, comm, &m));
    CHECK_OK(gdp_plan_check_consistent(m, comm));
    GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_cache_apply_step(s->cache, m));
    return m;
}

void lh_local_rows(const lh_stack *s, int64_t T, int64_t *first, int64_t *count) {
    *count = T / s->row_blocks;
    *first = s->row_block * *count;
}

void lh_stack_forward(lh_stack *s, const gdp_step_metadata *m, const float *x_full, float *outs[LAYERS]) {
    const int64_t T = m->padded_token_count;
    int64_t first, count;
    lh_local_rows(s, T, &first, &count);
    const size_t bytes = sizeof(float) * (size_t)(count * D_MODEL);
    float *x = malloc(bytes ? bytes : 1);
    memcpy(x, x_full + first * D_MODEL, bytes);
    void *xd = x; /* x where the stack's backend reads it */
    if (s->gpu) {
        xd = dev_alloc(bytes);
        dev_upload(xd, x, bytes);
    }
    for (int32_t l = 0; l < LAYERS; l++) {
        gdp_tensor xt;
        gdp_tensor_init(&xt, xd, GDP_DTYPE_FP32, 2, (const int64_t[]){count, D_MODEL});
        GDP_FATAL_IF_ERROR(lh_fatal_comm, gdp_layer_forward(s->layers[l], s->cache, m, &xt));
        if (s->gpu)
            dev_download(x, xd, bytes);
        if (count == T) {
            memcpy(outs[l], x, sizeof(float) * (size_t)(T * D_MODEL));
            continue;
        }
        memset(outs[l], 0, sizeof(float) * (size_t)(T * D_MODEL));
        if (s->row_owner)
            memcpy(outs[l] + first * D_MODEL, x, bytes);
        MPI_Allreduce(MPI_IN_PLACE, outs[l], (int)(T * D_MODEL), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    if (s->gpu)
        dev_free(xd);
    free(x);
}

int64_t lh_local_state(const lh_stack *s, int32_t slot, double *out) {
    int64_t k = 0;
    for (int32_t l = 0; l < LAYERS; l++) {
        gdp_tensor ssm, conv;
        gdp_cache_state_views(s->cache, l, &ssm, &conv);
        const int64_t ns = ssm.shape[1] * ssm.shape[2] * ssm.shape[3], nc = conv.shape[1] * conv.shape[2];
        lh_read_floats(s->gpu, ssm.data, slot * ns, ns, out + k);
        k += ns;
        lh_read_floats(s->gpu, conv.data, slot * nc, nc, out + k);
        k += nc;
    }
    return k;
}

int64_t lh_ref_state_as_local(const lh_stack *ref, const lh_stack *s, int32_t slot, double *out) {
    int64_t k = 0;
    for (int32_t l = 0; l < LAYERS; l++) {
        gdp_tensor ssm, conv;
        gdp_cache_state_views(ref->cache, l, &ssm, &conv);
        const int64_t NP = ssm.shape[2] * ssm.shape[3], W = conv.shape[2];
        const int64_t ns = ssm.shape[1] * NP, nc = conv.shape[1] * W;
        lh_read_floats(ref->gpu, ssm.data, slot * ns + s->head_begin * NP, s->num_heads * NP, out + k);
        k += s->num_heads * NP;
        double *c = malloc(sizeof(double) * (size_t)nc);
        lh_read_floats(ref->gpu, conv.data, slot * nc, nc, c);
        for (int32_t i = 0; i < s->n_conv_ranges; i++)
            for (int64_t r = 0; r < s->conv_rows[i]; r++)
                for (int64_t w = 0; w < W; w++)
                    out[k++] = c[(s->conv_begin[i] + r) * W + w];
        free(c);
    }
    return k;
}

/* ---- the step driver ---------------------------------------------------------------------- */
void lh_prepare_all(const tstep *t, const gdp_step_desc *d, const gdp_step_metadata *ms[MAX_STACKS]) {
    const char *names[MAX_STACKS] = {NULL};
    for (int k = 0; k < g_job.n_stacks; k++)
        ms[k] = lh_stack_prepare(g_job.stacks[k], d), names[k] = g_job.stacks[k]->name;
    agree_on_step(t, ms, g_job.n_stacks, names, g_job.step_no, g_job.reqs);
}

void lh_tag_rows(const tstep *t, const gdp_step_metadata *m, int32_t *tag_req, int32_t *tag_pos) {
    const int32_t S = m->decode_tokens;
    const request *reqs = g_job.reqs;
    for (int64_t row = 0; row < m->padded_token_count; row++)
        tag_req[row] = -1, tag_pos[row] = -1;
    for (int32_t i = 0; i < t->n_dec; i++)
        for (int32_t s = 0; s < S; s++)
            tag_req[i * S + s] = t->dec[i], tag_pos[i * S + s] = reqs[t->dec[i]].pos + s;
    for (int32_t i = 0; i < t->n_pre; i++)
        for (int32_t k = 0; k < t->tokens[i]; k++) {
            const int64_t row = m->prefill_token_offset + m->host.cu_seqlens[i] + k;
            tag_req[row] = t->pre[i], tag_pos[row] = reqs[t->pre[i]].pos + k;
        }
}

/* Compares the recorded deltas of every request row of this step in stacks sa and sb. */
static void compare_step_outputs(const char *what, int sa, int sb, const int32_t *tag_req, const int32_t *tag_pos,
                                 int64_t T, int kind) {
    const int64_t n = gather_step_rows(what, sa, sb, tag_req, tag_pos, T);
    if (n > 0)
        check_close(what, g_a, g_b, n, g_job.bar, GPU_BAR_OUT, kind);
}

void lh_forward_all(const gdp_step_metadata *ms[MAX_STACKS], float *xs[MAX_STACKS], const int32_t *tag_req,
                    const int32_t *tag_pos, float *finals[MAX_STACKS]) {
    const int64_t T = ms[0]->padded_token_count;
    const int n_stacks = g_job.n_stacks;
    float *outs[MAX_STACKS][LAYERS];
    for (int k = 0; k < n_stacks; k++) {
        for (int32_t l = 0; l < LAYERS; l++)
            outs[k][l] = malloc(sizeof(float) * (size_t)(T * D_MODEL));
        lh_stack_forward(g_job.stacks[k], ms[k], xs[k], outs[k]);
    }
    const int64_t pad_changed = record_deltas(n_stacks, T, xs, outs, tag_req, tag_pos);
    CHECK(pad_changed == 0, "step %d: %lld values of padding rows changed", g_job.step_no, (long long)pad_changed);
    char what[112];
    snprintf(what, sizeof what, "step %d: layer outputs, %s", g_job.step_no, g_job.vs);
    compare_step_outputs(what, 0, 1, tag_req, tag_pos, T, K_OUT);
    if (g_cuda) {
        snprintf(what, sizeof what, "step %d: layer outputs, GPU tp 1 vs CPU tp 1", g_job.step_no);
        compare_step_outputs(what, 1, 2, tag_req, tag_pos, T, K_CPU_OUT);
    }
    for (int k = 0; k < n_stacks; k++) {
        if (finals != NULL)
            memcpy(finals[k], outs[k][LAYERS - 1], sizeof(float) * (size_t)(T * D_MODEL));
        for (int32_t l = 0; l < LAYERS; l++)
            free(outs[k][l]);
    }
}

void lh_finish_step(const tstep *t, int32_t S) {
    advance_positions(t, S, g_job.reqs);
    lh_stack *const *st = g_job.stacks;
    char what[112];
    for (int32_t q = 0; q < g_job.n_reqs; q++) {
        const int32_t slot = g_job.reqs[q].slot;
        if (!g_job.reqs[q].live)
            continue;
        const int64_t na = lh_local_state(st[0], slot, g_a), nb = lh_ref_state_as_local(st[1], st[0], slot, g_b);
        CHECK(na == nb, "state sizes %lld vs %lld", (long long)na, (long long)nb);
        snprintf(what, sizeof what, "step %d: request %d states, %s", g_job.step_no, q, g_job.vs);
        check_close(what, g_a, g_b, na, g_job.bar, GPU_BAR_STATE, K_STATE);
        if (g_cuda) {
            const int64_t nr = lh_local_state(st[1], slot, g_a), nc = lh_local_state(st[2], slot, g_b);
            CHECK(nr == nc, "state sizes %lld vs %lld", (long long)nr, (long long)nc);
            snprintf(what, sizeof what, "step %d: request %d states, GPU tp 1 vs CPU tp 1", g_job.step_no, q);
            check_close(what, g_a, g_b, nr, g_job.bar, GPU_BAR_STATE, K_CPU_STATE);
        }
    }
}

void lh_run_step(const tstep *t) {
    g_job.step_no++;
    int32_t dec_slots[4], rel_slots[8];
    gdp_prefill_request pre[4];
    gdp_draft_accept acc[4];
    const gdp_step_desc d = lh_make_desc(t, g_job.reqs, dec_slots, rel_slots, pre, acc);
    const gdp_step_metadata *ms[MAX_STACKS] = {NULL};
    lh_prepare_all(t, &d, ms);
    const int64_t T = ms[0]->padded_token_count;
    float *x = malloc(sizeof(float) * (size_t)(T * D_MODEL));
    int32_t *tag_req = malloc(sizeof(int32_t) * (size_t)T), *tag_pos = malloc(sizeof(int32_t) * (size_t)T);
    lh_tag_rows(t, ms[0], tag_req, tag_pos);
    for (int64_t row = 0; row < T; row++) {
        if (tag_req[row] < 0)
            token_row(900000 + g_job.step_no, (int32_t)row, x + row * D_MODEL); /* seeded padding */
        else
            token_row(g_job.reqs[tag_req[row]].seed, tag_pos[row], x + row * D_MODEL);
    }
    float *xs[MAX_STACKS] = {x, x, x};
    lh_forward_all(ms, xs, tag_req, tag_pos, NULL);
    lh_finish_step(t, d.decode_tokens);
    free(x), free(tag_req), free(tag_pos);
}

void lh_job_end(double worst[K_KINDS]) {
    for (int k = 0; k < g_job.n_stacks; k++)
        lh_stack_free(g_job.stacks[k]);
    free(g_a), free(g_b);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Allreduce(g_job.worst, worst, K_KINDS, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
}

/* ---- the scenarios both tests run --------------------------------------------------------- */
void lh_scenario_chunked_and_decode(void) {
    request *q = g_job.reqs;
    const double bar = g_job.bar;
    q[A] = (request){.seed = 1}, q[A2] = (request){.seed = 1};
    q[B] = (request){.seed = 2}, q[B2] = (request){.seed = 2};
    /* A: one prefill of 170 then decodes; A2: the same tokens in chunks 64 + 64 + 43 */
    lh_run_step(&(tstep){.n_pre = 3, .pre = {A, A2, B}, .tokens = {170, 64, 3}, .flags = {NEW, NEW, NEW}});
    lh_run_step(&(tstep){.n_dec = 1, .dec = {A}, .n_pre = 2, .pre = {A2, B}, .tokens = {64, 2}});
    lh_run_step(&(tstep){.n_dec = 1, .dec = {B}, .n_pre = 2, .pre = {A2, B2}, .tokens = {43, 6}, .flags = {0, NEW}});
    compare_positions("A prefilled in chunks 64+64+42 vs one prefill", A2, 0, A, 0, 170, bar, K_SCENARIO);
    compare_positions("B2 one prefill vs B in chunks 3+2 (last shorter than W)", B, 0, B2, 0, 5, bar, K_SCENARIO);
    compare_positions("A decode of token 170 vs recomputing it in A2's prefill", A, 170, A2, 170, 1, BAR_RECOMPUTE,
                      K_RECOMPUTE);
    compare_positions("B decode of token 5 vs recomputing it in B2's prefill", B, 5, B2, 5, 1, BAR_RECOMPUTE,
                      K_RECOMPUTE);
    compare_states("A (prefill + decode) vs A2 (chunked prefill of the same 171 tokens) states", A, A2, BAR_RECOMPUTE,
                   K_RECOMPUTE);
    compare_states("B (chunks + decode) vs B2 (one prefill of 6) states", B, B2, BAR_RECOMPUTE, K_RECOMPUTE);
}

void lh_scenario_prefix(void) {
    request *q = g_job.reqs;
    const double bar = g_job.bar;
    q[C] = (request){.seed = 3}, q[C2] = (request){.seed = 3, .pos = 128};
    q[DD] = (request){.seed = 4}, q[D2] = (request){.seed = 4, .pos = 128};
    /* C saves at token 128 inside its 200-token slice, D at the end of its 128-token slice */
    lh_run_step(&(tstep){.n_rel = 4, .rel = {A, A2, B, B2}, .n_pre = 2, .pre = {C, DD}, .tokens = {200, 128},
                         .flags = {NEW | SAVE, NEW | SAVE}, .save = {0, 1}, .save_off = {128, 128}});
    lh_run_step(&(tstep){.n_pre = 3, .pre = {C2, D2, DD}, .tokens = {72, 32, 32},
                         .flags = {NEW | RESTORE, NEW | RESTORE, 0}, .restore = {0, 1, 0}});
    compare_positions("C2 restored at token 128 vs C uninterrupted", C2, 128, C, 128, 72, bar, K_SCENARIO);
    compare_states("C2 (restored + 72) vs C (200 in one slice) states", C2, C, bar, K_SCENARIO);
    compare_positions("D2 restored from a slice-end snapshot vs D continuing", D2, 128, DD, 128, 32, bar, K_SCENARIO);
    compare_states("D2 vs D states", D2, DD, bar, K_SCENARIO);
}

/* ---- bad input ---------------------------------------------------------------------------- */
void lh_refusal_begin(lh_refusal *r, lh_stack *s, int32_t slot) {
    memset(r, 0, sizeof *r);
    r->s = s, r->slot = slot, r->dslot[0] = slot;
    r->d = (gdp_step_desc){.decode_count = 1, .decode_tokens = 1, .decode_slots = r->dslot,
                           .bucket = GDP_BUCKET_AUTO};
    r->m = lh_stack_prepare(s, &r->d);
    int64_t first;
    lh_local_rows(s, r->m->padded_token_count, &first, &r->count);
    r->ns = lh_local_state(s, slot, g_a);
    const int64_t n = (r->count + 1) * D_MODEL;
    r->x_bytes = sizeof(float) * (size_t)n;
    r->x = calloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++)
        r->x[i] = (float)(i % 7);
    r->x_copy = malloc(r->x_bytes);
    memcpy(r->x_copy, r->x, r->x_bytes);
    r->xd = r->x;
    if (s->gpu) {
        r->xd = dev_alloc(r->x_bytes);
        dev_upload(r->xd, r->x, r->x_bytes);
    }
}

void lh_refusal_unchanged(lh_refusal *r, const char *what) {
    if (r->s->gpu)
        dev_download(r->x, r->xd, r->x_bytes);
    CHECK(!memcmp(r->x, r->x_copy, r->x_bytes), "%s: a refused forward modified x", what);
    lh_local_state(r->s, r->slot, g_b);
    CHECK(!memcmp(g_a, g_b, sizeof(double) * (size_t)r->ns), "%s: a refused forward modified the cache", what);
}

void lh_check_refused(const lh_stack *s, gdp_cache_t cache, const gdp_step_metadata *m, void *data, int64_t rows,
                      gdp_status_t status, const char *want) {
    gdp_tensor xt;
    gdp_tensor_init(&xt, data, GDP_DTYPE_FP32, 2, (const int64_t[]){rows, D_MODEL});
    CHECK_STATUS(gdp_layer_forward(s->layers[0], cache, m, &xt), status);
    if (want != NULL)
        CHECK(strstr(gdp_last_error(), want) != NULL, "rank %d: message '%s' lacks '%s'", g_rank, gdp_last_error(),
              want);
}

void lh_refuse_shape_and_unapplied(lh_refusal *r) {
    lh_stack *s = r->s;
    char want[64];
    snprintf(want, sizeof want, "[%lld, %d]", (long long)(r->count + 1), D_MODEL);
    lh_check_refused(s, s->cache, r->m, r->xd, r->count + 1, GDP_STATUS_INVALID_ARGUMENT, want);
    lh_refusal_unchanged(r, "wrong x shape");
    const gdp_step_metadata *m = NULL;
    CHECK_OK(gdp_plan_bcast(s->plan, s->plan_comm, 0, &r->d));
    CHECK_OK(gdp_plan_build(s->plan, s->cache, s->plan_comm, &m));
    lh_check_refused(s, s->cache, m, r->xd, r->count, GDP_STATUS_INVALID_USAGE, NULL);
    lh_refusal_unchanged(r, "unapplied metadata");
}

void lh_refusal_end(lh_refusal *r) {
    if (r->s->gpu)
        dev_free(r->xd);
    free(r->x), free(r->x_copy);
}
