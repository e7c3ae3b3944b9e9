/*
 * phase.c: the step phase recorder of phase.h: marks as CUDA events on the ctx's stream, or
 * host clock readings on the CPU backend, summed per phase once the work has finished.
 */
#include <string.h>
#include <time.h>

#include "gdp/profile.h"
#include "phase.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#endif
#if defined(GDP_ENABLE_NVTX) && defined(GDP_HAVE_CUDA)
#include <nvtx3/nvToolsExt.h> /* header-only NVTX 3 of the CUDA toolkit */
#define GDP_NVTX 1
#endif

/* The active recording of this thread (one at a time): its ctx and list. Thread-local and
 * not in the ctx, so the collectives, which know only a stream, can mark too. */
typedef struct phase_state {
    gdp_ctx_t       ctx;
    gdp_phase_list *list;
    gdp_phase_list *stages; /* the chunk op's stage marks, or NULL (not recorded) */
    int32_t         locked;
    gdp_status_t    status; /* the first failure of a mark, reported by gdp_phase_end */
} phase_state;

static _Thread_local phase_state *g_active;

static double host_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static gdp_status_t grow(gdp_phase_list *l) {
    const int32_t cap = l->cap ? 2 * l->cap : 64;
    int8_t *p = realloc(l->phase, (size_t)cap);
    if (p != NULL)
        l->phase = p;
    void **e = realloc(l->events, sizeof(void *) * (size_t)cap);
    if (e != NULL)
        l->events = e;
    double *t = realloc(l->t, sizeof(double) * (size_t)cap);
    if (t != NULL)
        l->t = t;
    if (p == NULL || e == NULL || t == NULL)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "phase timing: out of memory for %d marks", cap);
    memset(l->events + l->cap, 0, sizeof(void *) * (size_t)(cap - l->cap));
    l->cap = cap;
    return GDP_STATUS_SUCCESS;
}

/* With GDP_ENABLE_NVTX, each phase is also an NVTX range, so an nsys profile shows the same
 * phases (host-side ranges: for a captured graph they appear at its capture). */
static void nvtx_phase(int32_t index, int phase) {
#ifdef GDP_NVTX
    static const char *const names[GDP_MARK_NUM] = {"gdp: GEMM", "gdp: GDP ops", "gdp: collective",
                                                     "gdp: head + sampling"};
    if (index > 0)
        nvtxRangePop();
    if (phase >= 0 && phase < GDP_MARK_NUM)
        nvtxRangePushA(names[phase]);
#else
    (void)index, (void)phase;
#endif
}

/* One mark of `phase` into l; `nvtx`: also the NVTX range of a step phase (not for stage marks). */
static gdp_status_t record_mark(gdp_ctx_t ctx, gdp_phase_list *l, int phase, int nvtx) {
    if (l->n == l->cap)
        GDP_CHECK(grow(l));
    const int32_t i = l->n++;
    l->phase[i] = (int8_t)phase;
    if (nvtx)
        nvtx_phase(i, phase);
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA) {
        if (l->events[i] == NULL) {
            cudaEvent_t ev = NULL;
            GDP_CUDA_CHECK(cudaEventCreate(&ev));
            l->events[i] = ev;
        }
        /* Inside a stream capture a plain record only orders the capture's streams; an
         * external record becomes an event node that every replay records. */
        enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        (void)cudaStreamIsCapturing((cudaStream_t)ctx->stream, &cs);
        const cudaError_t err = cs == cudaStreamCaptureStatusActive
                                    ? cudaEventRecordWithFlags((cudaEvent_t)l->events[i], (cudaStream_t)ctx->stream,
                                                               cudaEventRecordExternal)
                                    : cudaEventRecord((cudaEvent_t)l->events[i], (cudaStream_t)ctx->stream);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "phase timing: cudaEventRecord failed");
        return GDP_STATUS_SUCCESS;
    }
#endif
    l->t[i] = host_now();
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t record(gdp_ctx_t ctx, gdp_phase_list *l, int phase) { return record_mark(ctx, l, phase, 1); }

gdp_status_t gdp_phase_begin(gdp_ctx_t ctx, gdp_phase_list *list, int phase) {
    return gdp_phase_begin_stages(ctx, list, NULL, phase);
}

gdp_status_t gdp_phase_begin_stages(gdp_ctx_t ctx, gdp_phase_list *list, gdp_phase_list *stages, int phase) {
    if (g_active != NULL)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "phase timing: a recording is already active on this ctx");
    phase_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "phase timing: out of memory");
    s->ctx = ctx;
    s->list = list;
    s->stages = stages;
    list->n = 0;
    if (stages != NULL)
        stages->n = 0;
    g_active = s;
    const gdp_status_t st = record(ctx, list, phase);
    if (st != GDP_STATUS_SUCCESS) {
        g_active = NULL;
        free(s);
    }
    return st;
}

void gdp_phase_mark(gdp_ctx_t ctx, int phase) {
    phase_state *s = g_active;
    if (s == NULL || s->ctx != ctx || s->locked > 0 || s->status != GDP_STATUS_SUCCESS)
        return;
    /* two marks in a row: the first phase was empty; keep one */
    if (s->list->n > 0 && s->list->phase[s->list->n - 1] == phase)
        return;
    s->status = record(ctx, s->list, phase);
}

void gdp_phase_mark_stream(void *stream, int phase) {
    phase_state *s = g_active;
    if (s != NULL && s->ctx->stream == stream)
        gdp_phase_mark(s->ctx, phase);
}

void gdp_phase_stage_mark_stream(void *stream, int mark) {
    phase_state *s = g_active;
    if (s == NULL || s->stages == NULL || s->ctx->stream != stream || s->status != GDP_STATUS_SUCCESS)
        return;
    s->status = record_mark(s->ctx, s->stages, mark, 0);
}

void gdp_phase_lock(gdp_ctx_t ctx, int phase) {
    phase_state *s = g_active;
    if (s == NULL || s->ctx != ctx)
        return;
    gdp_phase_mark(ctx, phase);
    s->locked++;
}

void gdp_phase_unlock(gdp_ctx_t ctx, int after) {
    phase_state *s = g_active;
    if (s == NULL || s->ctx != ctx)
        return;
    if (s->locked > 0)
        s->locked--;
    gdp_phase_mark(ctx, after);
}

gdp_status_t gdp_phase_end(gdp_ctx_t ctx) {
    phase_state *s = g_active;
    if (s == NULL || s->ctx != ctx)
        return GDP_STATUS_SUCCESS;
    gdp_status_t st = s->status;
    if (st == GDP_STATUS_SUCCESS)
        st = record(ctx, s->list, -1);
    g_active = NULL;
    free(s);
    return st;
}

/* Seconds between two marks of a list. */
static gdp_status_t mark_gap(gdp_ctx_t ctx, const gdp_phase_list *list, int32_t i, double *dt) {
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA) {
        float ms = 0;
        const cudaError_t err =
            cudaEventElapsedTime(&ms, (cudaEvent_t)list->events[i], (cudaEvent_t)list->events[i + 1]);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "phase timing: cudaEventElapsedTime failed (work not finished?)");
        *dt = ms * 1e-3;
        return GDP_STATUS_SUCCESS;
    }
#endif
    (void)ctx;
    *dt = list->t[i + 1] - list->t[i];
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_phase_sum(gdp_ctx_t ctx, const gdp_phase_list *list, double *sums, double *total) {
    for (int32_t i = 0; i + 1 < list->n; i++) {
        double dt = 0;
        GDP_CHECK(mark_gap(ctx, list, i, &dt));
        const int p = list->phase[i];
        if (p >= 0 && p < GDP_MARK_NUM)
            sums[p] += dt;
        *total += dt;
    }
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_phase_stage_sum(gdp_ctx_t ctx, const gdp_phase_list *stages, double *sums) {
    /* the stage each mark ends; a BEGIN mark ends nothing (the gap before it lies between calls) */
    static const int8_t stage_of[] = {-1,
                                      GDP_CHUNK_STAGE_CUMSUM,
                                      GDP_CHUNK_STAGE_WY,
                                      GDP_CHUNK_STAGE_STATE,
                                      GDP_CHUNK_STAGE_OUT,
                                      GDP_CHUNK_STAGE_OUT,
                                      GDP_CHUNK_STAGE_FUSED,
                                      GDP_CHUNK_STAGE_SPLIT_RUNS,
                                      GDP_CHUNK_STAGE_SPLIT_FIXUP,
                                      GDP_CHUNK_STAGE_SPLIT_CORRECT};
    const int marks = (int)(sizeof stage_of / sizeof stage_of[0]);
    for (int32_t i = 0; i + 1 < stages->n; i++) {
        const int mark = stages->phase[i + 1];
        if (mark < 0 || mark >= marks || stage_of[mark] < 0)
            continue;
        double dt = 0;
        GDP_CHECK(mark_gap(ctx, stages, i, &dt));
        sums[stage_of[mark]] += dt;
    }
    return GDP_STATUS_SUCCESS;
}

void gdp_phase_list_free(gdp_phase_list *list) {
    if (list == NULL)
        return;
#ifdef GDP_HAVE_CUDA
    for (int32_t i = 0; i < list->cap; i++)
        if (list->events[i] != NULL)
            (void)cudaEventDestroy((cudaEvent_t)list->events[i]);
#endif
    free(list->phase);
    free(list->events);
    free(list->t);
    memset(list, 0, sizeof *list);
}

/* ---- the public profile (include/gdp/profile.h) over the same marks ---------------------- */

static _Thread_local gdp_phase_list g_profile, g_profile_stages;

const char *gdp_chunk_stage_name(gdp_chunk_stage_t stage) {
    static const char *const names[GDP_CHUNK_STAGE_NUM] = {"cumsum", "wy",          "state",       "out",
                                                           "fused",  "split-runs", "split-fixup", "split-correct"};
    return (int)stage >= 0 && stage < GDP_CHUNK_STAGE_NUM ? names[stage] : NULL;
}

gdp_status_t gdp_profile_begin(gdp_ctx_t ctx) {
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_profile_begin"));
    return gdp_phase_begin_stages(ctx, &g_profile, &g_profile_stages, GDP_MARK_OPS);
}

gdp_status_t gdp_profile_end(gdp_ctx_t ctx, gdp_phase_times *times) {
    GDP_CHECK(gdp_ctx_check(ctx, "gdp_profile_end"));
    if (times == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_profile_end: times is NULL");
    GDP_CHECK(gdp_phase_end(ctx));
#ifdef GDP_HAVE_CUDA
    if (ctx->backend == GDP_BACKEND_CUDA) {
        const cudaError_t err = cudaStreamSynchronize((cudaStream_t)ctx->stream);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "gdp_profile_end: the profiled work failed on the device");
    }
#endif
    double sums[GDP_MARK_NUM] = {0}, total = 0;
    GDP_CHECK(gdp_phase_sum(ctx, &g_profile, sums, &total));
    double stage_sums[GDP_CHUNK_STAGE_NUM] = {0};
    GDP_CHECK(gdp_phase_stage_sum(ctx, &g_profile_stages, stage_sums));
    *times = (gdp_phase_times){.gemm_s = sums[GDP_MARK_GEMM], .ops_s = sums[GDP_MARK_OPS],
                               .collective_s = sums[GDP_MARK_COLLECTIVE], .head_s = sums[GDP_MARK_HEAD],
                               .total_s = total};
    memcpy(times->chunk_s, stage_sums, sizeof stage_sums);
    return GDP_STATUS_SUCCESS;
}
