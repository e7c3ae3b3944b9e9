/*
 * phase.h: measured phases of a step. A recorder on the ctx collects marks on the ctx's
 * stream: each mark starts a phase (GEMM, GDP ops, collective, head + sampling) that lasts
 * until the next mark. On CUDA a mark is an event recorded on the stream (inside a CUDA
 * graph capture it becomes an event node, re-recorded at every replay); on the CPU backend
 * it is the host clock (the CPU backend runs synchronously). The GEMM helper and the
 * collectives mark themselves, so the layers need no timing code of their own; the model
 * locks the recorder to "head" while the LM head and sampling run.
 *
 * Marks are free when no recording is active (one thread-local pointer test). One
 * recording per thread at a time.
 */
#ifndef GDP_PHASE_H
#define GDP_PHASE_H

#include <stdint.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Phase ids: the order of gdp_engine_phase_t (engine.h), which checks it. */
enum { GDP_MARK_GEMM = 0, GDP_MARK_OPS, GDP_MARK_COLLECTIVE, GDP_MARK_HEAD, GDP_MARK_NUM };

/* The marks of one recorded span: a step run eagerly, or a captured graph (whose events
 * are re-recorded at every replay, so the list is read again after each). */
typedef struct gdp_phase_list {
    int32_t n, cap;
    int8_t *phase;   /* [cap] the phase each mark starts (-1: the end mark) */
    void  **events;  /* [cap] cudaEvent_t, created on first use (CUDA)      */
    double *t;       /* [cap] host clock (CPU backend)                      */
} gdp_phase_list;

/* Starts recording into list (its marks are reused from the start) with a first mark of
 * `phase`. One recording per ctx at a time. */
gdp_status_t gdp_phase_begin(gdp_ctx_t ctx, gdp_phase_list *list, int phase);
/* The same, and the chunk op's stage marks (gdp_phase_stage_mark_stream) go to `stages` (NULL:
 * not recorded). */
gdp_status_t gdp_phase_begin_stages(gdp_ctx_t ctx, gdp_phase_list *list, gdp_phase_list *stages, int phase);
/* A mark of `phase` when the ctx records and is not locked; otherwise nothing. */
void gdp_phase_mark(gdp_ctx_t ctx, int phase);
/* The same from code that knows only the stream (the collectives): marks when the active
 * recording's ctx runs on `stream`. */
void gdp_phase_mark_stream(void *stream, int phase);
/* The chunk op's stage marks (kernels/chunk/launch.cu and stages.cuh): each mark ends the stage
 * named by its id, from the mark before it; BEGIN opens a call. The profile sums them per stage
 * (gdp_phase_times.chunk_s). Recorded only when the active recording's ctx runs on `stream` and
 * asked for stages. */
enum {
    GDP_CHUNK_MARK_BEGIN = 0,  /* the call starts                                  */
    GDP_CHUNK_MARK_CUMSUM = 1, /* the gate cumsums ended                           */
    GDP_CHUNK_MARK_WY = 2,     /* the WY stage ended                                */
    GDP_CHUNK_MARK_STATE = 3,  /* the state sweep ended                             */
    GDP_CHUNK_MARK_OUT = 4,    /* the output stage ended                            */
    GDP_CHUNK_MARK_END = 5,    /* the call ended (the zero tail, if any, counts as outputs) */
    GDP_CHUNK_MARK_FUSED = 6,  /* the one-kernel path's kernel ended               */
    GDP_CHUNK_MARK_SPLIT_RUNS = 7,    /* the Hopper split's plan and segment runs ended */
    GDP_CHUNK_MARK_SPLIT_FIXUP = 8,   /* its fix-up scan ended                           */
    GDP_CHUNK_MARK_SPLIT_CORRECT = 9, /* its correction (or second pass) ended           */
};
void gdp_phase_stage_mark_stream(void *stream, int mark);
/* The chunk kernels' mark after each stage (kernels/chunk/stages.cuh, hopper.cu): the profile's
 * stage times (gdp/profile.h; no cost unless a profile records on this stream).
 * kernels/dev/chunk_stages.cu defines it before this header to record its own events. */
#ifndef GDP_CHUNK_STAGE_MARK
#define GDP_CHUNK_STAGE_MARK(mark, stream) gdp_phase_stage_mark_stream((void *)(stream), (mark))
#endif
/* After the recorded work finished: seconds per chunk stage added to sums[GDP_CHUNK_STAGE_NUM]
 * (gdp/profile.h). */
gdp_status_t gdp_phase_stage_sum(gdp_ctx_t ctx, const gdp_phase_list *stages, double *sums);
/* Marks `phase` and ignores inner marks until the matching unlock, which marks `after`. */
void gdp_phase_lock(gdp_ctx_t ctx, int phase);
void gdp_phase_unlock(gdp_ctx_t ctx, int after);
/* The end mark; recording stops. */
gdp_status_t gdp_phase_end(gdp_ctx_t ctx);
/* After the recorded work finished (the stream synchronized): seconds per phase added to
 * sums[GDP_MARK_NUM], and the span's total added to *total. */
gdp_status_t gdp_phase_sum(gdp_ctx_t ctx, const gdp_phase_list *list, double *sums, double *total);
void gdp_phase_list_free(gdp_phase_list *list);

#ifdef __cplusplus
}
#endif

#endif /* GDP_PHASE_H */
