/*
 * sampling_params.c: the request-level sampling options of include/gdp/sampling.h: their
 * defaults and their validation (shared by the workload reader, gdp-run and the engine).
 * The sampling itself (candidates and merge, CPU and CUDA) is src/sampling.c.
 */
#include <math.h>

#include "gdp/sampling.h"
#include "internal.h"

gdp_sampling_params gdp_sampling_params_default(void) {
    return (gdp_sampling_params){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 0};
}

gdp_status_t gdp_sampling_params_check(const gdp_sampling_params *p, const char *what) {
    if (what == NULL)
        what = "sampling";
    if (p == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the sampling parameters are NULL", what);
    if (!isfinite(p->temperature) || p->temperature < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: temperature is %g; use 0 for greedy or a finite value > 0", what, (double)p->temperature);
    if (p->top_k < 0 || p->top_k > GDP_SAMPLING_MAX_CANDIDATES)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: top_k is %d; use 0 (off) or 1 .. %d", what, p->top_k,
                 GDP_SAMPLING_MAX_CANDIDATES);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f)) /* 0 (a zeroed struct) and 1 both mean off */
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: top_p is %g; use a value in (0, 1), or 1 (or 0) for off", what,
                 (double)p->top_p);
    return GDP_STATUS_SUCCESS;
}
