/*
 * cache.c: the distributed state cache (include/gdp/cache.h): per layer the ssm and conv
 * states of every slot, the optional draft-token states and prefix snapshots, the host
 * bookkeeping of which slots are in use, and gdp_cache_apply_step, which carries out a
 * built step's slot operations (accept/roll back, release, claim + zero or restore).
 * The plan (plan.c) validates a step against this bookkeeping before anything changes,
 * so apply only re-checks that the metadata belongs to the cache's current state. The
 * step's slot fills (zero, draft rollback, snapshot restore) come with the metadata (the
 * plan merged them into one op per slot) and run on every layer in one call of
 * gdp_fill_slots: one kernel launch on CUDA, reading the ops from the step's device
 * copy of the metadata, through a device table of the per-layer buffers built at init.
 */
#include <string.h>

#include "backend.h"
#include "cache_internal.h"
#include "step_meta.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#endif

static const char *k_cache_hint = "create it with gdp_cache_init()";

gdp_status_t gdp_cache_check_handle(const struct gdp_cache *cache, const char *op) {
    if (cache == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cache is NULL; %s", op, k_cache_hint);
    if (cache->magic != GDP_CACHE_MAGIC || cache->magic_end != GDP_CACHE_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: cache %p is not a live gdp cache (freed or corrupted); %s", op,
                 (const void *)cache, k_cache_hint);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cache_config_init(gdp_cache_config *out, const gdp_tp_shard *shard, int32_t n_slots) {
    static const char *op = "gdp_cache_config_init";
    if (out == NULL || shard == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and shard must not be NULL", op);
    if (n_slots < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: n_slots is %d; the cache needs at least 1 slot", op, n_slots);
    const gdp_layer_config *c = &shard->config;
    if (shard->num_heads > INT32_MAX || c->state_dim > INT32_MAX || c->head_dim > INT32_MAX ||
        shard->conv_dim > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: a TP-local size (H_t %lld, N %lld, P %lld, conv_dim_t %lld) exceeds int32", op,
                 (long long)shard->num_heads, (long long)c->state_dim, (long long)c->head_dim,
                 (long long)shard->conv_dim);
    memset(out, 0, sizeof *out);
    out->num_layers = c->num_layers;
    out->n_slots = n_slots;
    out->num_heads = (int32_t)shard->num_heads;
    out->state_dim = (int32_t)c->state_dim;
    out->head_dim = (int32_t)c->head_dim;
    out->conv_dim = (int32_t)shard->conv_dim;
    out->conv_width = c->conv_width;
    out->ssm_dtype = GDP_DTYPE_FP32;
    out->conv_dtype = GDP_DTYPE_FP32;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cache_config_init_cp(gdp_cache_config *out, const gdp_cp_shard *shard, int32_t n_slots) {
    static const char *op = "gdp_cache_config_init_cp";
    if (out == NULL || shard == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and shard must not be NULL", op);
    if (shard->cp_size < 1 || shard->num_heads < 1 || shard->num_heads * shard->cp_size != shard->tp.num_heads)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: shard was not filled by gdp_cp_shard_init", op);
    if (shard->conv_dim > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the CP-local conv_dim_c %lld exceeds int32", op,
                 (long long)shard->conv_dim);
    gdp_cache_config c;
    GDP_CHECK(gdp_cache_config_init(&c, &shard->tp, n_slots));
    /* The core of a CP rank runs H_c heads and their group(s): the states of nothing else. */
    c.num_heads = (int32_t)shard->num_heads;
    c.conv_dim = (int32_t)shard->conv_dim;
    *out = c;
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t validate_config(const gdp_cache_config *c, const char *op) {
    const struct { const char *name; int32_t value, min; } sizes[] = {
        {"num_layers", c->num_layers, 1}, {"n_slots", c->n_slots, 1},       {"num_heads", c->num_heads, 1},
        {"state_dim", c->state_dim, 1},   {"head_dim", c->head_dim, 1},     {"conv_dim", c->conv_dim, 1},
        {"conv_width", c->conv_width, 2}, {"max_draft_tokens", c->max_draft_tokens, 0},
        {"n_snapshots", c->n_snapshots, 0},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < sizes[i].min)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.%s is %d, must be >= %d", op, sizes[i].name,
                     sizes[i].value, sizes[i].min);
    if (c->ssm_dtype != GDP_DTYPE_FP32 && c->ssm_dtype != GDP_DTYPE_BF16)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.ssm_dtype is %s; the ssm state is fp32 or bf16", op,
                 gdp_dtype_name(c->ssm_dtype));
    if (c->conv_dtype != GDP_DTYPE_FP32 && c->conv_dtype != GDP_DTYPE_BF16 && c->conv_dtype != GDP_DTYPE_FP16)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.conv_dtype is %s; the conv state is fp32, bf16 or fp16", op,
                 gdp_dtype_name(c->conv_dtype));
    if (c->state_dim > GDP_MAX_HEAD_DIM || c->head_dim > GDP_MAX_HEAD_DIM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: state_dim %d and head_dim %d must be <= %d (the ops' limit)", op,
                 c->state_dim, c->head_dim, GDP_MAX_HEAD_DIM);
    return GDP_STATUS_SUCCESS;
}

/* Frees every buffer of a (possibly half-built) cache and the struct. */
static void cache_destroy(struct gdp_cache *c) {
    void **sets[] = {c->ssm, c->conv, c->draft_ssm, c->draft_conv, c->snap_ssm, c->snap_conv};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        if (sets[s] == NULL)
            continue;
        for (int32_t l = 0; l < c->cfg.num_layers; l++)
            gdp_buf_free(c->ctx, sets[s][l]);
        free(sets[s]);
    }
    gdp_buf_free(c->ctx, c->fill_tables); /* host memory on the CPU backend: free() */
    free(c->slot_used);
    free(c->draft_tokens);
    free(c->snap_saved);
    c->magic = c->magic_end = 0;
    free(c);
}

/* One buffer per layer of `per_layer` bytes into *set (NULL when per_layer is 0). */
static gdp_status_t alloc_layer_set(struct gdp_cache *c, void ***set, size_t per_layer, const char *what) {
    if (per_layer == 0)
        return GDP_STATUS_SUCCESS;
    *set = gdp_calloc((size_t)c->cfg.num_layers, sizeof(void *), what);
    if (*set == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    for (int32_t l = 0; l < c->cfg.num_layers; l++)
        GDP_CHECK(gdp_buf_alloc(c->ctx, per_layer, &(*set)[l], what));
    return GDP_STATUS_SUCCESS;
}

/* The per-layer buffers as one pointer table [GDP_FILL_TABLES][num_layers] in the backend's
 * memory, for gdp_fill_slots (a device kernel cannot read the host's arrays). */
static gdp_status_t build_fill_tables(struct gdp_cache *c) {
    const size_t L = (size_t)c->cfg.num_layers, bytes = GDP_FILL_TABLES * L * sizeof(void *);
    void **host = gdp_calloc(GDP_FILL_TABLES * L, sizeof(void *), "the cache's buffer table");
    if (host == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    void **const sets[GDP_FILL_TABLES] = {
        [GDP_FILL_SSM] = c->ssm,             [GDP_FILL_CONV] = c->conv,
        [GDP_FILL_DRAFT_SSM] = c->draft_ssm, [GDP_FILL_DRAFT_CONV] = c->draft_conv,
        [GDP_FILL_SNAP_SSM] = c->snap_ssm,   [GDP_FILL_SNAP_CONV] = c->snap_conv,
    };
    for (size_t t = 0; t < GDP_FILL_TABLES; t++)
        for (size_t l = 0; l < L; l++)
            host[t * L + l] = sets[t] != NULL ? sets[t][l] : NULL;
    if (c->ctx->backend == GDP_BACKEND_CPU) {
        c->fill_tables = host;
        return GDP_STATUS_SUCCESS;
    }
    void *dev = NULL;
    gdp_status_t st = gdp_buf_alloc(c->ctx, bytes, &dev, "the cache's device buffer table");
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_buf_upload(c->ctx, dev, host, bytes);
    free(host);
    if (st != GDP_STATUS_SUCCESS) {
        gdp_buf_free(c->ctx, dev);
        return st;
    }
    c->fill_tables = dev;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cache_init(gdp_cache_t *out, gdp_ctx_t ctx, const gdp_cache_config *config) {
    static const char *op = "gdp_cache_init";
    if (out == NULL || config == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and config must not be NULL", op);
    *out = NULL;
    GDP_CHECK(gdp_ctx_check(ctx, op));
    GDP_CHECK(validate_config(config, op));
    const gdp_cache_config *c = config;
    const size_t ssm_elems = (size_t)c->num_heads * c->state_dim * c->head_dim;
    const size_t conv_elems = (size_t)c->conv_dim * c->conv_width;

    struct gdp_cache *cache = gdp_calloc(1, sizeof *cache, "gdp_cache");
    if (cache == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    cache->magic = cache->magic_end = GDP_CACHE_MAGIC;
    static uint64_t caches_made;
    cache->serial = __atomic_add_fetch(&caches_made, 1, __ATOMIC_RELAXED);
    cache->ctx = ctx;
    cache->cfg = *c;
    cache->ssm_bytes = ssm_elems * gdp_dtype_size(c->ssm_dtype);
    cache->conv_bytes = conv_elems * gdp_dtype_size(c->conv_dtype);
    const size_t slots = (size_t)c->n_slots, S = (size_t)c->max_draft_tokens, snaps = (size_t)c->n_snapshots;
    gdp_status_t st = GDP_STATUS_SUCCESS;
    GDP_CHECK_GOTO(alloc_layer_set(cache, &cache->ssm, slots * cache->ssm_bytes, "the cache's ssm states"), st, fail);
    GDP_CHECK_GOTO(alloc_layer_set(cache, &cache->conv, slots * cache->conv_bytes, "the cache's conv states"), st,
                   fail);
    GDP_CHECK_GOTO(alloc_layer_set(cache, &cache->draft_ssm, slots * S * cache->ssm_bytes,
                                   "the cache's draft-token ssm states"),
                   st, fail);
    GDP_CHECK_GOTO(alloc_layer_set(cache, &cache->draft_conv, slots * S * cache->conv_bytes,
                                   "the cache's draft-token conv states"),
                   st, fail);
    GDP_CHECK_GOTO(alloc_layer_set(cache, &cache->snap_ssm, snaps * cache->ssm_bytes, "the cache's ssm snapshots"),
                   st, fail);
    GDP_CHECK_GOTO(alloc_layer_set(cache, &cache->snap_conv, snaps * cache->conv_bytes,
                                   "the cache's conv snapshots"),
                   st, fail);
    GDP_CHECK_GOTO(build_fill_tables(cache), st, fail);
    cache->slot_used = gdp_calloc(slots, 1, "the cache's slot table");
    cache->draft_tokens = gdp_calloc(slots, sizeof(int32_t), "the cache's draft table");
    cache->snap_saved = gdp_calloc(snaps ? snaps : 1, 1, "the cache's snapshot table");
    if (cache->slot_used == NULL || cache->draft_tokens == NULL || cache->snap_saved == NULL) {
        st = GDP_STATUS_SYSTEM_ERROR;
        goto fail;
    }
    cache->generation = 1;
    *out = cache;
    return GDP_STATUS_SUCCESS;
fail:
    cache_destroy(cache);
    return st;
}

gdp_status_t gdp_cache_free(gdp_cache_t cache) {
    if (cache == NULL)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(gdp_cache_check_handle(cache, "gdp_cache_free"));
    cache_destroy(cache);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cache_get_config(gdp_cache_t cache, gdp_cache_config *config) {
    GDP_CHECK(gdp_cache_check_handle(cache, "gdp_cache_get_config"));
    if (config == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_cache_get_config: config out-pointer is NULL");
    *config = cache->cfg;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cache_free_slot_count(gdp_cache_t cache, int32_t *n_free) {
    GDP_CHECK(gdp_cache_check_handle(cache, "gdp_cache_free_slot_count"));
    if (n_free == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_cache_free_slot_count: n_free out-pointer is NULL");
    int32_t n = 0;
    for (int32_t s = 0; s < cache->cfg.n_slots; s++)
        n += !cache->slot_used[s];
    *n_free = n;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cache_slot_in_use(gdp_cache_t cache, int32_t slot, int32_t *in_use) {
    static const char *op = "gdp_cache_slot_in_use";
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    if (in_use == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: in_use out-pointer is NULL", op);
    if (slot < 0 || slot >= cache->cfg.n_slots)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: slot %d is outside [0, %d)", op, slot, cache->cfg.n_slots);
    *in_use = cache->slot_used[slot];
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cache_snapshot_saved(gdp_cache_t cache, int32_t snapshot, int32_t *saved) {
    static const char *op = "gdp_cache_snapshot_saved";
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    if (saved == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: saved out-pointer is NULL", op);
    if (snapshot < 0 || snapshot >= cache->cfg.n_snapshots)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: snapshot %d is outside [0, %d) (config.n_snapshots)", op, snapshot,
                 cache->cfg.n_snapshots);
    *saved = cache->snap_saved[snapshot];
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t check_layer(const struct gdp_cache *c, int32_t layer, const char *op) {
    if (layer < 0 || layer >= c->cfg.num_layers)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: layer %d is outside [0, %d) (the cache's num_layers)", op, layer,
                 c->cfg.num_layers);
    return GDP_STATUS_SUCCESS;
}

/* A view of one of the cache's buffers: gdp_tensor_init, which cannot fail here (the buffer
 * of these extents was allocated at gdp_cache_init). */
static void set_view(gdp_tensor *t, void *data, gdp_dtype_t dtype, int32_t ndim, const int64_t *shape) {
    (void)gdp_tensor_init(t, data, dtype, ndim, shape);
}

gdp_status_t gdp_cache_state_views(gdp_cache_t cache, int32_t layer, gdp_tensor *ssm, gdp_tensor *conv) {
    static const char *op = "gdp_cache_state_views";
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    GDP_CHECK(check_layer(cache, layer, op));
    const gdp_cache_config *c = &cache->cfg;
    if (ssm != NULL)
        set_view(ssm, cache->ssm[layer], c->ssm_dtype, 4,
                 (const int64_t[]){c->n_slots, c->num_heads, c->state_dim, c->head_dim});
    if (conv != NULL)
        set_view(conv, cache->conv[layer], c->conv_dtype, 3, (const int64_t[]){c->n_slots, c->conv_dim, c->conv_width});
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cache_snapshot_views(gdp_cache_t cache, int32_t layer, gdp_tensor *ssm, gdp_tensor *conv) {
    static const char *op = "gdp_cache_snapshot_views";
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    GDP_CHECK(check_layer(cache, layer, op));
    const gdp_cache_config *c = &cache->cfg;
    if (c->n_snapshots == 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the cache keeps no prefix snapshots; set config.n_snapshots > 0 at gdp_cache_init", op);
    if (ssm != NULL)
        set_view(ssm, cache->snap_ssm[layer], c->ssm_dtype, 4,
                 (const int64_t[]){c->n_snapshots, c->num_heads, c->state_dim, c->head_dim});
    if (conv != NULL)
        set_view(conv, cache->snap_conv[layer], c->conv_dtype, 3,
                 (const int64_t[]){c->n_snapshots, c->conv_dim, c->conv_width});
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cache_draft_views(gdp_cache_t cache, int32_t layer, int32_t S, gdp_tensor *ssm, gdp_tensor *conv) {
    static const char *op = "gdp_cache_draft_views";
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    GDP_CHECK(check_layer(cache, layer, op));
    const gdp_cache_config *c = &cache->cfg;
    if (c->max_draft_tokens == 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the cache keeps no draft-token states; set config.max_draft_tokens > 0 at gdp_cache_init", op);
    if (S < 1 || S > c->max_draft_tokens)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: S = %d tokens is outside [1, %d] (config.max_draft_tokens)", op, S,
                 c->max_draft_tokens);
    if (ssm != NULL)
        set_view(ssm, cache->draft_ssm[layer], c->ssm_dtype, 5,
                 (const int64_t[]){c->n_slots, S, c->num_heads, c->state_dim, c->head_dim});
    if (conv != NULL)
        set_view(conv, cache->draft_conv[layer], c->conv_dtype, 4,
                 (const int64_t[]){c->n_slots, S, c->conv_dim, c->conv_width});
    return GDP_STATUS_SUCCESS;
}

/* ---- applying a step ------------------------------------------------------------------ */

gdp_status_t gdp_cache_apply_step(gdp_cache_t cache, const gdp_step_metadata *meta) {
    static const char *op = "gdp_cache_apply_step";
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    if (meta == NULL || meta->step == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: meta is NULL; pass the metadata gdp_plan_build returned", op);
    if (meta->cache_id != cache)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: the metadata was built against another cache (%p, this is %p); build the step with this cache",
                 op, meta->cache_id, (const void *)cache);
    if (meta->cache_generation != cache->generation)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: the metadata was built against cache state %llu but this cache is at state %llu (another "
                 "cache, or a step applied twice or built before an earlier step was applied); call gdp_plan_build "
                 "with this cache, then apply once",
                 op, (unsigned long long)meta->cache_generation, (unsigned long long)cache->generation);
    const gdp_step_desc *step = meta->step;
    const int32_t *fills_host = NULL, *fills_dev = NULL;
    int32_t n_fill = 0;
    GDP_CHECK(gdp_step_meta_fills(meta, &fills_host, &fills_dev, &n_fill));
    /* The states: accepts (the slot's state becomes the one after its n_accepted-th draft
     * token), then new requests (zeroed or restored), merged by the plan into one fill per
     * slot and carried out on every layer at once. */
    const gdp_fill_slots_args fill = {
        .num_layers = cache->cfg.num_layers,
        .tables = cache->fill_tables,
        .ops = fills_dev,
        .n_ops = n_fill,
        .ssm_bytes = cache->ssm_bytes,
        .conv_bytes = cache->conv_bytes,
        .n_slots = cache->cfg.n_slots,
        .draft_rows = (int64_t)cache->cfg.n_slots * cache->cfg.max_draft_tokens,
        .n_snapshots = cache->cfg.n_snapshots,
    };
    GDP_CHECK(gdp_fill_slots(cache->ctx, &fill));
    /* The bookkeeping, in the same order. 1. Accepts end the pending draft steps. */
    for (int32_t a = 0; a < step->accept_count; a++)
        cache->draft_tokens[step->accept[a].slot] = 0;
    /* 2. Releases. */
    for (int32_t r = 0; r < step->release_count; r++) {
        cache->slot_used[step->release_slots[r]] = 0;
        cache->draft_tokens[step->release_slots[r]] = 0;
    }
    /* 3. New requests are claimed (the plan resolved GDP_SLOT_AUTO; their states were filled above). */
    for (int32_t i = 0; i < step->prefill_count; i++) {
        const gdp_prefill_request *p = &step->prefill[i];
        cache->draft_tokens[p->slot] = 0; /* any step but a draft step ends a pending draft */
        if (!(p->flags & GDP_PREFILL_NEW))
            continue;
        cache->slot_used[p->slot] = 1;
    }
    /* 4. Decode slots of a step with draft tokens hold a pending draft step. */
    const int32_t S = step->decode_tokens;
    for (int32_t d = 0; d < step->decode_count; d++)
        cache->draft_tokens[step->decode_slots[d]] = S > 1 && cache->cfg.max_draft_tokens >= S ? S : 0;
    /* 5. Snapshots this step saves (the layers write them during their forward). */
    for (int32_t i = 0; i < step->prefill_count; i++)
        if (step->prefill[i].flags & GDP_PREFILL_SAVE)
            cache->snap_saved[step->prefill[i].save_snapshot] = 1;
    cache->generation++;
    return GDP_STATUS_SUCCESS;
}

/* ---- swapping a slot out and in (preemption) ---------------------------------------------- */

gdp_status_t gdp_cache_swap_bytes(gdp_cache_t cache, size_t *bytes) {
    GDP_CHECK(gdp_cache_check_handle(cache, "gdp_cache_swap_bytes"));
    if (bytes == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_cache_swap_bytes: bytes out-pointer is NULL");
    *bytes = (size_t)cache->cfg.num_layers * (cache->ssm_bytes + cache->conv_bytes);
    return GDP_STATUS_SUCCESS;
}

/* One copy between the cache's memory and the swap buffer, queued on the cache's stream. */
static gdp_status_t swap_copy(const struct gdp_cache *c, void *dst, const void *src, size_t bytes) {
#ifdef GDP_HAVE_CUDA
    if (c->ctx->backend == GDP_BACKEND_CUDA) {
        const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)c->ctx->stream);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "gdp_cache_swap: cudaMemcpyAsync of %zu bytes failed", bytes);
        return GDP_STATUS_SUCCESS;
    }
#endif
    memcpy(dst, src, bytes);
    return GDP_STATUS_SUCCESS;
}

/* The wait after a swap's copies: none when buf is device memory (its copies are ordered on the
 * stream before anything queued after them, and no host code touches buf), else one stream wait,
 * so that a host buffer holds the state (or may be reused) when the call returns. */
static gdp_status_t swap_wait(const struct gdp_cache *c, const void *buf) {
#ifdef GDP_HAVE_CUDA
    if (c->ctx->backend == GDP_BACKEND_CUDA) {
        struct cudaPointerAttributes attr;
        cudaError_t err = cudaPointerGetAttributes(&attr, buf);
        if (err == cudaSuccess && attr.type == cudaMemoryTypeDevice)
            return GDP_STATUS_SUCCESS;
        (void)cudaGetLastError(); /* a pointer the runtime does not know is host memory: not an error */
        err = cudaStreamSynchronize((cudaStream_t)c->ctx->stream);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "gdp_cache_swap: waiting for the copies failed");
    }
#endif
    (void)c;
    (void)buf;
    return GDP_STATUS_SUCCESS;
}

/* Row `row` of every layer's ssm and conv buffers (ssm_set, conv_set) to the swap buffer
 * (to_buf) or back, layer by layer, ssm then conv; then the wait (swap_wait). */
static gdp_status_t swap_state(const struct gdp_cache *c, void *const *ssm_set, void *const *conv_set, size_t row,
                               void *buf, bool to_buf) {
    char *at = buf;
    for (int32_t l = 0; l < c->cfg.num_layers; l++) {
        char *ssm = (char *)ssm_set[l] + row * c->ssm_bytes, *conv = (char *)conv_set[l] + row * c->conv_bytes;
        GDP_CHECK(swap_copy(c, to_buf ? at : ssm, to_buf ? ssm : at, c->ssm_bytes));
        at += c->ssm_bytes;
        GDP_CHECK(swap_copy(c, to_buf ? at : conv, to_buf ? conv : at, c->conv_bytes));
        at += c->conv_bytes;
    }
    return swap_wait(c, buf);
}

gdp_status_t gdp_cache_swap_out(gdp_cache_t cache, int32_t slot, int32_t pending_S, int32_t keep, void *buf) {
    static const char *op = "gdp_cache_swap_out";
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    struct gdp_cache *c = cache;
    if (buf == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: buf is NULL; pass gdp_cache_swap_bytes bytes of host memory (or, on CUDA, device memory)", op);
    if (slot < 0 || slot >= c->cfg.n_slots || !c->slot_used[slot])
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: slot %d is %s; swap out a claimed slot of [0, %d)", op, slot,
                 slot < 0 || slot >= c->cfg.n_slots ? "out of range" : "free", c->cfg.n_slots);
    /* pending_S 0: the slot's own state (a draft step whose every token was kept left the
     * slot holding the state after all of them, whatever the draft marker says) */
    if (pending_S > 0 && (pending_S != c->draft_tokens[slot] || keep < 1 || keep > pending_S))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: slot %d has a pending draft step of S = %d (0: none) but the call says S = %d with %d kept "
                 "(keep must be in 1..S)", op, slot, c->draft_tokens[slot], pending_S, keep);
    const size_t row = pending_S > 0 ? (size_t)slot * (size_t)pending_S + (size_t)(keep - 1) : (size_t)slot;
    return swap_state(c, pending_S > 0 ? c->draft_ssm : c->ssm, pending_S > 0 ? c->draft_conv : c->conv, row, buf,
                      true);
}

gdp_status_t gdp_cache_swap_in(gdp_cache_t cache, int32_t slot, const void *buf) {
    static const char *op = "gdp_cache_swap_in";
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    struct gdp_cache *c = cache;
    if (buf == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: buf is NULL; pass what gdp_cache_swap_out wrote", op);
    if (slot < 0 || slot >= c->cfg.n_slots || c->slot_used[slot])
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: slot %d is %s; swap into a free slot of [0, %d)", op, slot,
                 slot < 0 || slot >= c->cfg.n_slots ? "out of range" : "in use", c->cfg.n_slots);
    GDP_CHECK(swap_state(c, c->ssm, c->conv, (size_t)slot, (void *)buf, false));
    c->slot_used[slot] = 1;
    c->draft_tokens[slot] = 0;
    return GDP_STATUS_SUCCESS;
}
