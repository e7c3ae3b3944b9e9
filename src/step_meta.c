/*
 * step_meta.c: reading a step's metadata buffer (step_meta.h) where its writer, the plan,
 * is not involved: the slot fills that gdp_cache_apply_step carries out.
 */
#include "step_meta.h"

gdp_status_t gdp_step_meta_fills(const gdp_step_metadata *meta, const int32_t **host, const int32_t **device,
                                 int32_t *count) {
    if (meta == NULL || meta->host_buffer == NULL || meta->buffer_bytes < M_HEADER_WORDS * sizeof(int32_t) ||
        ((const int32_t *)meta->host_buffer)[M_MAGIC] != META_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_cache_apply_step: meta is not a step built by gdp_plan_build");
    const int32_t *base = meta->host_buffer;
    const int32_t n = base[M_FILL_COUNT], off = base[M_FILL_OFFSET];
    if (n < 0 || off < M_HEADER_WORDS || (size_t)off + (size_t)n * FILL_WORDS > meta->buffer_bytes / sizeof(int32_t))
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "gdp_cache_apply_step: the metadata's fill section (%d at word %d) lies "
                 "outside its %zu bytes", n, off, meta->buffer_bytes);
    *host = base + off;
    /* The device copy has the host buffer's layout: the same offset from its first array. */
    *device = meta->device.decode_slots + (*host - meta->host.decode_slots);
    *count = n;
    return GDP_STATUS_SUCCESS;
}
