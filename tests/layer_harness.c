/*
 * layer_harness.c: the shared harness of the multi-rank layer tests (test_layer_tp.c,
 * test_layer_cp.c; see layer_harness.h): job set-up and summary, device memory, the request
 * table's step description, token rows, the delta record and the backend's comparison bar.
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

int64_t lh_local_state(bool gpu, gdp_cache_t cache, int32_t slot, double *out) {
    int64_t k = 0;
    for (int32_t l = 0; l < LAYERS; l++) {
        gdp_tensor ssm, conv;
        gdp_cache_state_views(cache, l, &ssm, &conv);
        const int64_t ns = ssm.shape[1] * ssm.shape[2] * ssm.shape[3], nc = conv.shape[1] * conv.shape[2];
        lh_read_floats(gpu, ssm.data, slot * ns, ns, out + k);
        k += ns;
        lh_read_floats(gpu, conv.data, slot * nc, nc, out + k);
        k += nc;
    }
    return k;
}

void lh_free_stack(gdp_layer_t layers[LAYERS], gdp_cache_t cache, gdp_plan_t plan) {
    for (int32_t l = 0; l < LAYERS; l++)
        CHECK_OK(gdp_layer_free(layers[l]));
    CHECK_OK(gdp_cache_free(cache));
    CHECK_OK(gdp_plan_free(plan));
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

void lh_agree_on_step(const tstep *t, const gdp_step_metadata *const ms[MAX_STACKS], int n_stacks,
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

void lh_advance_positions(const tstep *t, int32_t S, request *reqs) {
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

int64_t lh_record_deltas(int n_stacks, int64_t T, float *const xs[MAX_STACKS], float *outs[MAX_STACKS][LAYERS],
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
double lh_check_close(const char *what, const double *a, const double *b, int64_t n, double cpu_bar,
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

int64_t lh_gather_positions(const char *what, int32_t ra, int32_t pa, int32_t rb, int32_t pb, int32_t n) {
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

int64_t lh_gather_step_rows(const char *what, int sa, int sb, const int32_t *tag_req, const int32_t *tag_pos,
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
