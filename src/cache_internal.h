/*
 * cache_internal.h: the state cache's struct (include/gdp/cache.h is its public face), for
 * the files that read its slot state or buffers: cache.c, plan.c (a step is validated
 * against the slots) and layer.c (the layer takes its state views and checks the pairing).
 */
#ifndef GDP_CACHE_INTERNAL_H
#define GDP_CACHE_INTERNAL_H

#include "gdp/cache.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GDP_CACHE_MAGIC 0x67647073u /* "gdps" */

struct gdp_cache {
    uint32_t         magic;
    uint64_t         serial;      /* n-th cache this process made: alike on every rank of an
                                   * SPMD job, unlike the address (the layer's pairing check) */
    gdp_ctx_t        ctx;
    gdp_cache_config cfg;
    size_t           ssm_bytes;   /* one slot's ssm state of one layer: H_t*K*V elements  */
    size_t           conv_bytes;  /* one slot's conv state of one layer: conv_dim_t*W     */
    void           **ssm;         /* [num_layers] -> [n_slots, H_t, K, V]                 */
    void           **conv;        /* [num_layers] -> [n_slots, conv_dim_t, W]             */
    void           **draft_ssm;   /* [num_layers] -> [n_slots * S_max * ssm] or NULL      */
    void           **draft_conv;  /* [num_layers] -> [n_slots * S_max * conv] or NULL     */
    void           **snap_ssm;    /* [num_layers] -> [n_snapshots, H_t, K, V] or NULL     */
    void           **snap_conv;   /* [num_layers] -> [n_snapshots, conv_dim_t, W] or NULL */
    uint8_t         *slot_used;   /* [n_slots] host bookkeeping, identical on every rank  */
    int32_t         *draft_tokens;/* [n_slots] S of the slot's pending draft step, 0: none */
    uint8_t         *snap_saved;  /* [n_snapshots]                                        */
    uint64_t         generation;  /* bumped by every applied step                         */
    void           **fill_tables; /* [GDP_FILL_TABLES * num_layers] the buffers above, in the
                                     backend's memory (device on CUDA) for gdp_fill_slots */
    uint32_t         magic_end;
};

/* Validates a cache handle. */
gdp_status_t gdp_cache_check_handle(const struct gdp_cache *cache, const char *op);

#ifdef __cplusplus
}
#endif

#endif /* GDP_CACHE_INTERNAL_H */
