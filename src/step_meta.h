/*
 * step_meta.h: the layout of a step's metadata buffer (gdp_step_metadata.host_buffer and
 * its device copy), shared by its writer, the plan (plan.c builds it), and its readers, the
 * state cache (cache.c applies the step's slot fills) and the layer (through the public
 * arrays). A header of int32 words, then the arrays at the offsets the header names.
 * Keeping it here, not in plan.c, is what lets cache.c read a step without naming the plan.
 */
#ifndef GDP_STEP_META_H
#define GDP_STEP_META_H

#include "gdp/plan.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define META_MAGIC 0x4d504447 /* "GDPM": a metadata buffer */

/* Header words of the metadata buffer. */
enum {
    M_MAGIC = 0, M_BUCKET, M_DECODE_COUNT, M_DECODE_TOKENS, M_PREFILL_COUNT, M_PD, M_PP, M_TOKENS, M_OFFSET,
    M_ROWS, M_PREFILL_TOKENS, M_SAVES, M_CHUNK_SAVES, M_NC, M_NCDP, M_M, M_RELEASE_COUNT, M_ACCEPT_COUNT,
    M_FILL_COUNT, M_FILL_OFFSET, /* the slot fills: count, and word offset from the buffer start */
    M_HEADER_WORDS
};
#define FILL_WORDS 3 /* slot, source, row: gdp_fill_slots_args.ops */

/* The step's slot fills (gdp_fill_slots_args.ops: [count][3] int32, distinct slots, in the
 * order of gdp_cache_apply_step), in host memory and in the backend's copy of the metadata
 * buffer. INVALID_ARGUMENT when meta holds no fill section (not from gdp_plan_build). */
gdp_status_t gdp_step_meta_fills(const gdp_step_metadata *meta, const int32_t **host, const int32_t **device,
                                 int32_t *count);

#ifdef __cplusplus
}
#endif

#endif /* GDP_STEP_META_H */
