/*
 * profile.h: measured phases of work on a ctx, for benchmarks and serving stacks. Between
 * gdp_profile_begin and gdp_profile_end, the library marks the ctx's stream at every GEMM
 * (cuBLASLt / BLAS) and every collective of the comm layer; what lies between is counted as
 * GDP ops (conv, prepare, chunked / recurrent GDP, norms, copies) and the LM head with its
 * sampling as head. On CUDA the marks are events (also inside a graph capture: end then
 * reads the times of the last replay only if called after it; benchmarks time eager runs),
 * on the CPU host clocks. gdp-run's report uses the same marks (engine.h).
 *
 * On CUDA the profile also splits the chunk op's time (gdp_chunk_gated_delta_product and its
 * varlen form) by stage: the gate cumsums, the WY stage (w, u and the chunk's inverse), the
 * state sweep, and the outputs (o, with the zero fill of rows past the last sequence), or a
 * one-kernel path (GDP_CHUNK_PATH=fused, or the Hopper kernel unsplit) whole, or the Hopper
 * kernel's segment split by its launches: the segment runs (the plan and every segment's run),
 * the fix-up scan, and the outputs' correction (or, with chunk states, the second pass). The
 * stages are consecutive kernels on one stream, so they add up to the op's time. The CPU backend
 * leaves them 0.
 */
#ifndef GDP_PROFILE_H
#define GDP_PROFILE_H

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Stages of the chunk op (gdp_phase_times.chunk_s). */
typedef enum gdp_chunk_stage {
    GDP_CHUNK_STAGE_CUMSUM = 0, /* the per-chunk gate cumsums                     */
    GDP_CHUNK_STAGE_WY,         /* w, u and the triangular inverse of each chunk  */
    GDP_CHUNK_STAGE_STATE,      /* the state sweep: chunk states and final states */
    GDP_CHUNK_STAGE_OUT,        /* the outputs o (and the tail's zero fill)       */
    GDP_CHUNK_STAGE_FUSED,      /* the one-kernel path, whole                     */
    GDP_CHUNK_STAGE_SPLIT_RUNS,    /* the Hopper split: its plan and segment runs */
    GDP_CHUNK_STAGE_SPLIT_FIXUP,   /* the Hopper split: the fix-up scan           */
    GDP_CHUNK_STAGE_SPLIT_CORRECT, /* the Hopper split: the outputs' correction,
                                      or the second pass with chunk states       */
    GDP_CHUNK_STAGE_NUM
} gdp_chunk_stage_t;

/* "cumsum", "wy", "state", "out", "fused", "split-runs", "split-fixup", "split-correct"; NULL for
 * any other value. */
GDP_API const char *gdp_chunk_stage_name(gdp_chunk_stage_t stage);

typedef struct gdp_phase_times {
    double gemm_s, ops_s, collective_s, head_s; /* seconds per phase                  */
    double total_s;                             /* first mark to last                 */
    double chunk_s[GDP_CHUNK_STAGE_NUM];        /* seconds per chunk-op stage, summed
                                                   over the profile's chunk calls (in
                                                   ops_s; CUDA only)                 */
} gdp_phase_times;

/* Starts marking the ctx's stream (one profile per thread at a time). INVALID_USAGE when a
 * profile or an engine's recording is already active on this thread. */
GDP_API gdp_status_t gdp_profile_begin(gdp_ctx_t ctx);
/* Ends it, waits for the ctx's stream (CUDA), and returns the phases. */
GDP_API gdp_status_t gdp_profile_end(gdp_ctx_t ctx, gdp_phase_times *times);

#ifdef __cplusplus
}
#endif

#endif /* GDP_PROFILE_H */
