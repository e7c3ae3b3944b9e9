/*
 * profile.h: measured phases of work on a ctx, for benchmarks and serving stacks. Between
 * gdp_profile_begin and gdp_profile_end, the library marks the ctx's stream at every GEMM
 * (cuBLASLt / BLAS) and every collective of the comm layer; what lies between is counted as
 * GDP ops (conv, prepare, chunked / recurrent GDP, norms, copies) and the LM head with its
 * sampling as head. On CUDA the marks are events (also inside a graph capture: end then
 * reads the times of the last replay only if called after it; benchmarks time eager runs),
 * on the CPU host clocks. gdp-run's report uses the same marks (engine.h).
 */
#ifndef GDP_PROFILE_H
#define GDP_PROFILE_H

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdp_phase_times {
    double gemm_s, ops_s, collective_s, head_s; /* seconds per phase                  */
    double total_s;                             /* first mark to last                 */
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
