/*
 * layer.c: one GDP mixer layer's tensor- (and context-) parallel shard (include/gdp/layer.h):
 * weights copied from a checkpoint shard, a workspace sized for the largest step seen, and
 * the forward pass of one step: pre-RMSNorm + in_proj GEMM, the decode block (conv update
 * and decode prepare, one launch where they fit; recurrent update on the slots, with the
 * gated norm in its launch in a step of decode rows only where it fits: decode_core.h), the
 * prefill block (varlen conv, prefill prepare, chunked GDP from the slots' states,
 * prefix-snapshot saves), grouped gated RMSNorm, out_proj, the TP collective and the
 * residual add.
 *
 * Context parallelism (cp > 1, gdp-layer.md 3.1, docs/cp.md): x holds this CP rank's 1/cp of
 * the step's rows. The "mixer core" (both blocks above: conv, prepare, recurrence) runs on the
 * whole step for the CP rank's slice of the TP shard's heads and groups, with the core's own
 * conv weights, A_log and dt_bias (sliced at init). Around it, two all-to-alls over the CP
 * group: in_proj's sections V_m, K_m, Q, b_m and a (each cut by heads or groups for every
 * destination, K and Q replicated when groups are shared) go to the ranks that run them, and
 * the core's output y comes back to the ranks that hold its rows. The gate z never leaves its
 * rank: the gated norm reads it on the same rows in_proj wrote it. With cp = 1 the core is
 * the TP shard and reads in_proj's output in place.
 *
 * Everything here is backend-neutral: the ops pick their backend from the ctx, and the
 * few other things the layer does (GEMMs, buffer copies, index-driven row copies) go
 * through backend.c. Every index array any of them reads comes from the metadata's
 * `device` arrays (== host on CPU), and no host value of an index decides a launch, so
 * on CUDA the forward pass only enqueues work on the ctx's stream: it never waits for the
 * device and (outside the comm's own collectives) never talks to the other ranks.
 *
 * Dtypes: the residual stream x is fp32 on both backends. The CPU backend computes in
 * fp32 (double inside the ops); the CUDA backend keeps weights and activations in bf16
 * (A_log fp32), its GEMMs accumulate in fp32, and out_proj adds into the fp32 x.
 */
#include <stdio.h>
#include <string.h>

#include "gdp/layer.h"
#include "decode_core.h"
#include "backend.h"
#include "cache_internal.h"
#include "workspace.h"

#define GDP_LAYER_MAGIC 0x6764706cu /* "gdpl" */

/* One copy of the pre-core all-to-all's packing: `width` columns of in_proj's output (TP
 * layout, from column src_col) into the send block of CP rank `dest` (core layout, dst_col). */
typedef struct cp_pack {
    int32_t dest;
    int64_t src_col, dst_col, width;
} cp_pack;

struct gdp_layer {
    uint32_t      magic;
    gdp_ctx_t     ctx;
    gdp_comm_t    comm;        /* NULL: tp = 1                                        */
    gdp_comm_t    cp_comm;     /* NULL: cp = 1                                        */
    gdp_tp_mode_t mode;
    gdp_tp_shard  shard;
    gdp_cp_shard  cp;          /* the core's slice of the shard (cp_size 1: all of it) */
    int32_t       layer_index; /* the layer's index in the stack and in the cache     */
    gdp_dtype_t   act;         /* activation and weight dtype: fp32 CPU, bf16 CUDA    */
    gdp_dtype_t   res;         /* the residual stream x and the collective: fp32      */
    int32_t       blas;        /* holds a reference to the ctx's GEMM state           */
    int32_t       debug_agree; /* GDP_PLAN_DEBUG=1: agree before every forward's work */
    uint64_t      agreed_cache;/* serial of the cache whose pairing all ranks agreed on:
                                  * a serial, not an address, so every rank decides alike  */
    /* TP-local sizes */
    int64_t D, H, G, P, N, M, W, d_inner, conv_dim, proj_dim, ba_dim;
    /* the mixer core's sizes: the TP-local ones, or the CP rank's slice (H_c, G_c, ...) */
    int64_t cH, cG, c_inner, c_conv, c_ba;
    int64_t core_dim;  /* cp > 1: columns per row of the core's in_proj input (V..|K..|Q|b..|a) */
    double  norm_eps, out_norm_eps;
    /* weights, in backend buffers */
    void *norm_w;      /* [D]                 */
    void *in_proj;     /* [proj_dim, D]       */
    void *conv_w;      /* [c_conv, W]    the core's channels */
    void *A_log;       /* [cH] fp32      the core's heads    */
    void *dt_bias;     /* [cH]                               */
    void *out_norm_w;  /* [d_inner]           */
    void *out_proj;    /* [D, d_inner]        */
    /* cp > 1: the pre-core all-to-all's copies, (3M+2) per destination */
    cp_pack *pack;
    int32_t  n_pack;
    /* workspace */
    void   *ws;
    size_t  ws_bytes;
    int64_t ws_grows; /* reallocations of ws (gdp_layer_workspace_grows) */
    /* gdp_layer_init_shared: the layer whose weights this one uses (NULL: its own), and how many
     * layers use this one's */
    struct gdp_layer *owner;
    int32_t sharers;
    uint32_t magic_end;
};

static gdp_status_t check_layer(const struct gdp_layer *l, const char *op) {
    if (l == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: layer is NULL; create it with gdp_layer_init()", op);
    if (l->magic != GDP_LAYER_MAGIC || l->magic_end != GDP_LAYER_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: layer %p is not a live gdp layer (freed or corrupted)", op,
                 (const void *)l);
    return GDP_STATUS_SUCCESS;
}

/* A view of backend memory; stride == NULL: contiguous. */
static gdp_tensor view(void *data, gdp_dtype_t dtype, int32_t ndim, const int64_t *shape, const int64_t *stride) {
    gdp_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.ndim = ndim;
    for (int32_t d = 0; d < ndim; d++) {
        t.shape[d] = shape[d];
        t.stride[d] = stride ? stride[d] : 0;
    }
    return t;
}
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

/* ---- init ------------------------------------------------------------------------------- */

/* Checks one weight tensor of the shard: present, contiguous, float, exactly `shape`. */
static gdp_status_t check_weight(const char *op, const char *name, const gdp_tensor *t, int32_t ndim,
                                 const int64_t *shape, uint32_t dtypes) {
    char what[64];
    snprintf(what, sizeof what, "weights->%s", name);
    GDP_CHECK(gdp_check_tensor(op, what, t, ndim, shape, dtypes));
    return gdp_check_contiguous(op, what, t);
}

/* Copies a host weight tensor, converted to `dtype`, into a new backend buffer. */
static gdp_status_t upload_weight(gdp_ctx_t ctx, const gdp_tensor *t, gdp_dtype_t dtype, void **out,
                                  const char *what) {
    const int64_t n = gdp_tensor_numel(t);
    const size_t bytes = (size_t)n * gdp_dtype_size(dtype);
    void *host = gdp_calloc((size_t)n, gdp_dtype_size(dtype), what);
    if (host == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    if (t->dtype == dtype) {
        memcpy(host, t->data, bytes);
    } else {
        for (int64_t i = 0; i < n; i++)
            gdp_store_elem(host, dtype, i, gdp_tensor_get(t, i));
    }
    gdp_status_t st = gdp_buf_alloc(ctx, bytes, out, what);
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_buf_upload(ctx, *out, host, bytes);
    free(host);
    return st;
}

static void layer_destroy(struct gdp_layer *l) {
    void *bufs[] = {l->ws, l->norm_w, l->in_proj, l->conv_w, l->A_log, l->dt_bias, l->out_norm_w, l->out_proj};
    /* a shared layer owns its workspace only; the weights are its owner's */
    const size_t owned = l->owner != NULL ? 1 : sizeof bufs / sizeof bufs[0];
    for (size_t i = 0; i < owned; i++)
        gdp_buf_free(l->ctx, bufs[i]);
    if (l->owner != NULL)
        l->owner->sharers--;
    free(l->pack);
    if (l->blas)
        gdp_gemm_release(l->ctx);
    l->magic = l->magic_end = 0;
    free(l);
}

/* Copies `count` rows of a contiguous host weight (rows = dim 0) from src_row to dst_row of
 * another of the same dtype and row size. */
static void copy_weight_rows(gdp_tensor *dst, int64_t dst_row, const gdp_tensor *src, int64_t src_row, int64_t count) {
    const size_t row_bytes = (size_t)(gdp_tensor_numel(src) / src->shape[0]) * gdp_dtype_size(src->dtype);
    memcpy((char *)dst->data + (size_t)dst_row * row_bytes, (const char *)src->data + (size_t)src_row * row_bytes,
           (size_t)count * row_bytes);
}

/* A host tensor of `rows` rows shaped like `like` otherwise (data owned: free(t->data)). */
static gdp_status_t host_rows_like(const gdp_tensor *like, int64_t rows, gdp_tensor *t, const char *what) {
    int64_t shape[GDP_MAX_DIMS];
    for (int32_t d = 0; d < like->ndim; d++)
        shape[d] = d == 0 ? rows : like->shape[d];
    const size_t n = (size_t)(gdp_tensor_numel(like) / like->shape[0]) * (size_t)rows;
    void *data = gdp_calloc(n ? n : 1, gdp_dtype_size(like->dtype), what);
    if (data == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    gdp_tensor_init(t, data, like->dtype, like->ndim, shape);
    return GDP_STATUS_SUCCESS;
}

/* The mixer core's parameters for the layer's CP slice, uploaded: the conv channels of its
 * V, K, Q sections (gdp_cp_shard_conv_section), A_log and dt_bias of its heads. With cp = 1
 * the slices are the whole TP-local tensors. */
static gdp_status_t upload_core_params(struct gdp_layer *l, const gdp_layer_weights *w) {
    const gdp_cp_shard *cs = &l->cp;
    gdp_tensor conv, A_log, dt_bias;
    memset(&conv, 0, sizeof conv), memset(&A_log, 0, sizeof A_log), memset(&dt_bias, 0, sizeof dt_bias);
    gdp_status_t st = GDP_STATUS_SUCCESS;
    GDP_CHECK_GOTO(host_rows_like(&w->conv, l->c_conv, &conv, "the core's conv weight"), st, done);
    GDP_CHECK_GOTO(host_rows_like(&w->A_log, l->cH, &A_log, "the core's A_log"), st, done);
    GDP_CHECK_GOTO(host_rows_like(&w->dt_bias, l->cH, &dt_bias, "the core's dt_bias"), st, done);
    for (int32_t i = 0; i < cs->tp.num_conv_sections; i++) {
        gdp_cp_section sec;
        GDP_CHECK_GOTO(gdp_cp_shard_conv_section(cs, i, &sec), st, done);
        copy_weight_rows(&conv, sec.core_offset, &w->conv, sec.tp.local_offset + sec.slice_begin, sec.rows);
    }
    copy_weight_rows(&A_log, 0, &w->A_log, cs->head_begin, l->cH);
    copy_weight_rows(&dt_bias, 0, &w->dt_bias, cs->head_begin, l->cH);
    GDP_CHECK_GOTO(upload_weight(l->ctx, &conv, l->act, &l->conv_w, "the layer's conv weight"), st, done);
    GDP_CHECK_GOTO(upload_weight(l->ctx, &A_log, GDP_DTYPE_FP32, &l->A_log, "the layer's A_log"), st, done);
    GDP_CHECK_GOTO(upload_weight(l->ctx, &dt_bias, l->act, &l->dt_bias, "the layer's dt_bias"), st, done);
done:
    free(conv.data), free(A_log.data), free(dt_bias.data);
    return st;
}

/* The pre-core all-to-all's copies: for every CP rank, every in_proj section but z, the
 * columns of that rank's slice in this rank's in_proj output and where they go in the rank's
 * send block (the core layout). K and Q slices of a shared group go to each of its ranks. */
static gdp_status_t build_cp_pack(struct gdp_layer *l) {
    const int32_t cp = l->cp.cp_size, n_sec = l->shard.num_in_proj_sections;
    l->pack = gdp_calloc((size_t)cp * (size_t)(n_sec - 1), sizeof *l->pack, "the layer's all-to-all copies");
    if (l->pack == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    l->n_pack = 0;
    for (int32_t dest = 0; dest < cp; dest++) {
        gdp_cp_shard ds;
        GDP_CHECK(gdp_cp_shard_init(&ds, &l->shard, dest, cp));
        for (int32_t i = 1; i < n_sec; i++) { /* section 0 is z: it stays here */
            gdp_cp_section sec;
            GDP_CHECK(gdp_cp_shard_in_proj_section(&ds, i, &sec));
            l->pack[l->n_pack++] = (cp_pack){.dest = dest, .src_col = sec.tp.local_offset + sec.slice_begin,
                                             .dst_col = sec.core_offset, .width = sec.rows};
        }
    }
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_layer_init(gdp_layer_t *out, gdp_ctx_t ctx, gdp_comm_t comm, const gdp_layer_weights *weights,
                            gdp_tp_mode_t mode) {
    return gdp_layer_init_cp(out, ctx, comm, NULL, weights, mode);
}

gdp_status_t gdp_layer_init_cp(gdp_layer_t *out, gdp_ctx_t ctx, gdp_comm_t comm, gdp_comm_t cp_comm,
                               const gdp_layer_weights *weights, gdp_tp_mode_t mode) {
    static const char *op = "gdp_layer_init";
    if (out == NULL || weights == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and weights must not be NULL", op);
    *out = NULL;
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if ((int)mode < 0 || mode >= GDP_TP_MODE_NUM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: mode %d is not a gdp_tp_mode_t (GDP_TP_MODE_ALLREDUCE or GDP_TP_MODE_SEQUENCE_PARALLEL)", op,
                 (int)mode);
    const gdp_dtype_t act = gdp_backend_act_dtype(ctx->backend);
    const gdp_dtype_t res = GDP_DTYPE_FP32;
    const char *why = NULL;
    if (!gdp_gemm_supported_ex(ctx, act, act, &why) || !gdp_gemm_supported_ex(ctx, act, res, &why))
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: %s", op, why);

    const gdp_tp_shard *sh = &weights->shard;
    GDP_CHECK(gdp_layer_config_validate(&sh->config));
    int32_t rank = 0, size = 1;
    if (comm != NULL) {
        GDP_CHECK(gdp_comm_rank(comm, &rank));
        GDP_CHECK(gdp_comm_size(comm, &size));
    }
    if (rank != sh->tp_rank || size != sh->tp_size)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the weights are the shard of tp rank %d of %d but the comm is rank %d of %d%s; load the shard "
                 "of this rank (gdp_checkpoint_load_layer_shard with the comm's rank and size)",
                 op, sh->tp_rank, sh->tp_size, rank, size, comm == NULL ? " (no comm: tp = 1)" : "");
    if (weights->layer < 0 || weights->layer >= sh->config.num_layers)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: weights->layer is %d, outside [0, %d) (config.num_layers)", op,
                 weights->layer, sh->config.num_layers);
    int32_t cp_rank = 0, cp_size = 1;
    if (cp_comm != NULL) {
        GDP_CHECK(gdp_comm_rank(cp_comm, &cp_rank));
        GDP_CHECK(gdp_comm_size(cp_comm, &cp_size));
    }
    if (cp_size > 1 && cp_comm == comm)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: comm and cp_comm are the same comm (%d ranks); pass the TP group as comm and the CP group as "
                 "cp_comm (rank = tp_rank + tp * cp_rank, see gdp_parallel_ranks)",
                 op, size);
    gdp_cp_shard cps;
    GDP_CHECK(gdp_cp_shard_init(&cps, sh, cp_rank, cp_size));
    const gdp_layer_config *c = &sh->config;
    const int64_t D = c->hidden_size, H = sh->num_heads, G = sh->num_groups, P = c->head_dim, N = c->state_dim;
    const int64_t M = c->num_householder, W = c->conv_width, d_inner = sh->d_inner, C = sh->conv_dim;
    const int64_t proj = sh->in_proj_dim;
    if (d_inner != H * P || C != M * d_inner + (M + 1) * G * N || proj != d_inner + C + (M + 1) * H)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the shard's sizes disagree (d_inner %lld vs H_t*P %lld, conv_dim %lld, in_proj_dim %lld); fill "
                 "it with gdp_tp_shard_init",
                 op, (long long)d_inner, (long long)(H * P), (long long)C, (long long)proj);
    const uint32_t wt = GDP_DT_FLOAT;
    GDP_CHECK(check_weight(op, "norm_weight", &weights->norm_weight, 1, SHAPE(D), wt));
    GDP_CHECK(check_weight(op, "in_proj", &weights->in_proj, 2, SHAPE(proj, D), wt));
    GDP_CHECK(check_weight(op, "conv", &weights->conv, 2, SHAPE(C, W), wt));
    GDP_CHECK(check_weight(op, "A_log", &weights->A_log, 1, SHAPE(H), GDP_DT(GDP_DTYPE_FP32)));
    GDP_CHECK(check_weight(op, "dt_bias", &weights->dt_bias, 1, SHAPE(H), wt));
    GDP_CHECK(check_weight(op, "out_norm_weight", &weights->out_norm_weight, 1, SHAPE(d_inner), wt));
    GDP_CHECK(check_weight(op, "out_proj", &weights->out_proj, 2, SHAPE(D, d_inner), wt));

    struct gdp_layer *l = gdp_calloc(1, sizeof *l, "gdp_layer");
    if (l == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    l->magic = l->magic_end = GDP_LAYER_MAGIC;
    l->ctx = ctx;
    /* A group of one rank is no group: the out_proj GEMM then adds into x in place, instead of
     * a zeroed partial, a copy of x into it and a one-rank all-reduce back (three device
     * operations a layer that gdp-run, whose comm always exists, paid at tp = 1). */
    l->comm = size > 1 ? comm : NULL;
    l->cp_comm = cp_size > 1 ? cp_comm : NULL;
    l->mode = mode;
    l->shard = *sh;
    l->cp = cps;
    l->layer_index = weights->layer;
    l->act = act;
    l->res = res;
    const char *dbg = getenv("GDP_PLAN_DEBUG");
    l->debug_agree = dbg != NULL && dbg[0] != 0 && strcmp(dbg, "0") != 0;
    l->D = D, l->H = H, l->G = G, l->P = P, l->N = N, l->M = M, l->W = W;
    l->d_inner = d_inner, l->conv_dim = C, l->proj_dim = proj, l->ba_dim = (M + 1) * H;
    l->cH = cps.num_heads, l->cG = cps.num_groups, l->c_inner = cps.d_inner, l->c_conv = cps.conv_dim;
    l->c_ba = (M + 1) * cps.num_heads, l->core_dim = cps.core_dim;
    l->norm_eps = c->norm_eps;
    l->out_norm_eps = c->out_norm_eps;
    gdp_status_t st = GDP_STATUS_SUCCESS;
    GDP_CHECK_GOTO(gdp_gemm_acquire(ctx), st, fail);
    l->blas = 1;
    GDP_CHECK_GOTO(upload_weight(ctx, &weights->norm_weight, act, &l->norm_w, "the layer's norm weight"), st, fail);
    GDP_CHECK_GOTO(upload_weight(ctx, &weights->in_proj, act, &l->in_proj, "the layer's in_proj"), st, fail);
    GDP_CHECK_GOTO(upload_core_params(l, weights), st, fail);
    if (l->cp_comm != NULL)
        GDP_CHECK_GOTO(build_cp_pack(l), st, fail);
    GDP_CHECK_GOTO(upload_weight(ctx, &weights->out_norm_weight, act, &l->out_norm_w, "the layer's out_norm weight"),
                   st, fail);
    GDP_CHECK_GOTO(upload_weight(ctx, &weights->out_proj, act, &l->out_proj, "the layer's out_proj"), st, fail);
    *out = l;
    return GDP_STATUS_SUCCESS;
fail:
    layer_destroy(l);
    return st;
}

gdp_status_t gdp_layer_init_shared(gdp_layer_t *out, gdp_ctx_t ctx, gdp_layer_t src) {
    static const char *op = "gdp_layer_init_shared";
    if (out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out must not be NULL", op);
    *out = NULL;
    GDP_CHECK(gdp_ctx_check(ctx, op));
    GDP_CHECK(check_layer(src, op));
    struct gdp_layer *owner = src->owner != NULL ? src->owner : src;
    if (ctx->backend != owner->ctx->backend || ctx->device != owner->ctx->device)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the weights live on the %s backend, device %d, but ctx is on the %s backend, device %d; share "
                 "them with a ctx of the same device",
                 op, owner->ctx->backend == GDP_BACKEND_CUDA ? "CUDA" : "CPU", owner->ctx->device,
                 ctx->backend == GDP_BACKEND_CUDA ? "CUDA" : "CPU", ctx->device);
    if (owner->comm != NULL || owner->cp_comm != NULL)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED,
                 "%s: src is a layer of a TP or CP group (tp %d, cp %d), whose comm another stream cannot share; "
                 "create each replica with gdp_layer_init and a comm of its own",
                 op, owner->shard.tp_size, owner->cp.cp_size);
    struct gdp_layer *l = gdp_calloc(1, sizeof *l, "gdp_layer");
    if (l == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    *l = *owner; /* sizes, config and weight pointers */
    l->ctx = ctx;
    l->ws = NULL, l->ws_bytes = 0;
    l->pack = NULL, l->n_pack = 0; /* cp = 1: none */
    l->agreed_cache = 0;
    l->blas = 0;
    l->owner = owner;
    l->sharers = 0;
    const gdp_status_t st = gdp_gemm_acquire(ctx);
    if (st != GDP_STATUS_SUCCESS) {
        l->magic = l->magic_end = 0;
        free(l);
        return st;
    }
    l->blas = 1;
    owner->sharers++;
    *out = l;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_layer_free(gdp_layer_t layer) {
    if (layer == NULL)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(check_layer(layer, "gdp_layer_free"));
    if (layer->sharers > 0)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "gdp_layer_free: %d layers made by gdp_layer_init_shared still use this layer's weights; free them "
                 "first",
                 layer->sharers);
    layer_destroy(layer);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_layer_get_shard(gdp_layer_t layer, gdp_tp_shard *shard) {
    GDP_CHECK(check_layer(layer, "gdp_layer_get_shard"));
    if (shard == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_layer_get_shard: shard out-pointer is NULL");
    *shard = layer->shard;
    return GDP_STATUS_SUCCESS;
}

int64_t gdp_layer_workspace_grows(const struct gdp_layer *layer) { return layer->ws_grows; }

gdp_status_t gdp_layer_get_act_dtype(gdp_layer_t layer, gdp_dtype_t *dtype) {
    GDP_CHECK(check_layer(layer, "gdp_layer_get_act_dtype"));
    if (dtype == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_layer_get_act_dtype: dtype out-pointer is NULL");
    *dtype = layer->act;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_layer_get_cp_shard(gdp_layer_t layer, gdp_cp_shard *shard) {
    GDP_CHECK(check_layer(layer, "gdp_layer_get_cp_shard"));
    if (shard == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_layer_get_cp_shard: shard out-pointer is NULL");
    *shard = layer->cp;
    return GDP_STATUS_SUCCESS;
}

/* ---- workspace -------------------------------------------------------------------------- */

/* The scratch buffers of one step; NULL when a block is absent. T is the step's padded rows,
 * Tc = T / cp the rows of this CP rank (T without context parallelism), T_local the rows of
 * x. The core's buffers (decode and prefill blocks) cover all T rows for the core's heads. */
typedef struct step_ws {
    void *xn_local; /* [T_local, D]   SP: this rank's normed rows                           */
    void *xn;       /* [Tc, D]        normed input of in_proj                                */
    void *proj;     /* [Tc, proj_dim] in_proj output                                         */
    void *y;        /* [Tc, d_inner]  mixer output of every TP-local head (the gate z is read
                       from proj in place)                                                   */
    void *normed;   /* [Tc, d_inner]  gated-norm output                                       */
    void *out;      /* [Tc, D] res    out_proj partial (+ residual) before the collective     */
    /* cp > 1: the two all-to-alls and the core's whole-step input and output */
    void *cp_send;   /* [cp, Tc, core_dim] in_proj sections of this rank's rows, per destination */
    void *core_proj; /* [T, core_dim]      the core's sections of every row (received)          */
    void *core_y;    /* [T, c_inner]       the core's output                                     */
    void *cp_y;      /* [cp, Tc, c_inner]  this rank's rows of every CP rank's heads (received)  */
    /* decode block: n = pd requests, S tokens, E = S*M expanded rows each */
    void *d_conv, *d_q, *d_k, *d_v, *d_beta, *d_g, *d_o;
    /* prefill block: R rows */
    void *p_conv, *p_q, *p_k, *p_v, *p_beta, *p_g;
    void *h0;           /* [pp, cH, N, P] ssm dtype: initial states gathered from the slots */
    void *chunk_states; /* [num_chunks, cH, N, P] ssm dtype, when the step saves one        */
} step_ws;

/* Lays out the workspace of a step (gdp_ws_add's aligned regions) and, with base != NULL, points *ws
 * into it. Returns its bytes, or SIZE_MAX when they overflow size_t (the allocation then fails and
 * says so). */
static size_t plan_ws(const struct gdp_layer *l, const gdp_step_metadata *m, gdp_dtype_t ssm_dtype, int64_t T_local,
                      char *base, step_ws *ws) {
    const size_t es = gdp_dtype_size(l->act), ss = gdp_dtype_size(ssm_dtype), rs = gdp_dtype_size(l->res);
    const size_t T = (size_t)m->padded_token_count, Tc = T / (size_t)l->cp.cp_size;
    const size_t D = (size_t)l->D, di = (size_t)l->d_inner;
    const size_t H = (size_t)l->cH, N = (size_t)l->N, P = (size_t)l->P, M = (size_t)l->M, C = (size_t)l->c_conv;
    const size_t dec_rows = (size_t)m->padded_decode_count * (size_t)m->decode_tokens, E = dec_rows * M;
    const size_t R = (size_t)m->prefill_rows, pp = (size_t)m->padded_prefill_count;
    const bool cp = l->cp_comm != NULL;
    const size_t sizes[] = {
        l->mode == GDP_TP_MODE_SEQUENCE_PARALLEL && l->comm != NULL ? (size_t)T_local * D * es : 0, /* xn_local */
        Tc * D * es, Tc * (size_t)l->proj_dim * es, Tc * di * es, Tc * di * es, Tc * D * rs,
        cp ? T * (size_t)l->core_dim * es : 0, cp ? T * (size_t)l->core_dim * es : 0,
        cp ? T * (size_t)l->c_inner * es : 0, cp ? T * (size_t)l->c_inner * es : 0,
        dec_rows * C * es, E * H * N * es, E * H * N * es, E * H * P * es, E * H * es, E * H * 4, E * H * P * es,
        R * C * es, R * H * N * es, R * M * H * N * es, R * M * H * P * es, R * M * H * es, R * H * 4,
        pp * H * N * P * ss,
        m->chunk_state_saves > 0 ? (size_t)m->num_chunks * H * N * P * ss : 0,
    };
    void **slots[] = {&ws->xn_local, &ws->xn,      &ws->proj,   &ws->y,      &ws->normed,
                      &ws->out,      &ws->cp_send, &ws->core_proj, &ws->core_y, &ws->cp_y, &ws->d_conv,
                      &ws->d_q,      &ws->d_k,     &ws->d_v,    &ws->d_beta, &ws->d_g,  &ws->d_o,
                      &ws->p_conv,   &ws->p_q,     &ws->p_k,    &ws->p_v,    &ws->p_beta, &ws->p_g,
                      &ws->h0,       &ws->chunk_states};
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof slots / sizeof slots[0], "one size per buffer");
    size_t cur = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t at = 0;
        if (!gdp_ws_add(&cur, &at, sizes[i] > (size_t)INT64_MAX ? -1 : (int64_t)sizes[i], 1))
            return SIZE_MAX;
        if (base != NULL)
            *slots[i] = sizes[i] ? base + at : NULL;
    }
    return gdp_ws_end(cur);
}

/* ---- forward ------------------------------------------------------------------------------ */

/* The rules that pair a layer with a cache (the same for every step). */
static gdp_status_t validate_pairing(const struct gdp_layer *l, const struct gdp_cache *cache, const char *op) {
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    if (cache->ctx->backend != l->ctx->backend)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the cache's backend (%d) differs from the layer's (%d)", op,
                 (int)cache->ctx->backend, (int)l->ctx->backend);
    const gdp_cache_config *cc = &cache->cfg;
    if (l->layer_index >= cc->num_layers)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the layer is layer %d of the stack but the cache holds %d layers; size the cache with "
                 "config.num_layers > %d",
                 op, l->layer_index, cc->num_layers, l->layer_index);
    /* The cache holds the states of the heads the core runs: the TP shard's, or its CP slice. */
    if (cc->num_heads != l->cH || cc->state_dim != l->N || cc->head_dim != l->P || cc->conv_dim != l->c_conv ||
        cc->conv_width != l->W)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the cache holds (H %d, N %d, P %d, conv_dim %d, W %d) per slot but this layer shard's mixer "
                 "core needs (%lld, %lld, %lld, %lld, %lld)%s; fill its config with %s from this shard",
                 op, cc->num_heads, cc->state_dim, cc->head_dim, cc->conv_dim, cc->conv_width, (long long)l->cH,
                 (long long)l->N, (long long)l->P, (long long)l->c_conv, (long long)l->W,
                 l->cp.cp_size > 1 ? " (the CP-local heads H/(tp*cp))" : "",
                 l->cp.cp_size > 1 ? "gdp_cache_config_init_cp" : "gdp_cache_config_init");
    return GDP_STATUS_SUCCESS;
}

/* Rows of x this rank holds in a step of T rows: T / cp, split again over tp with sequence
 * parallel; -1 when T does not split. */
static int64_t local_rows(const struct gdp_layer *l, int64_t T) {
    const int64_t tp = l->shard.tp_size, cp = l->cp.cp_size;
    if (T % cp != 0)
        return -1;
    const int64_t Tc = T / cp;
    if (l->mode != GDP_TP_MODE_SEQUENCE_PARALLEL || l->comm == NULL)
        return Tc;
    return Tc % tp == 0 ? Tc / tp : -1;
}

/* The step's rules: the metadata and x. */
static gdp_status_t validate_step(const struct gdp_layer *l, const struct gdp_cache *cache,
                                  const gdp_step_metadata *m, const gdp_tensor *x, const char *op) {
    if (m == NULL || m->step == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: meta is NULL; pass the metadata gdp_plan_build returned", op);
    if (x == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: x is NULL", op);
    if (m->num_householder != l->M)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the metadata was built for M = %d Householder copies, the layer has M = %lld; configure the plan "
                 "with num_householder = %lld",
                 op, m->num_householder, (long long)l->M, (long long)l->M);
    if (m->cache_id != cache || cache->generation != m->cache_generation + 1)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE,
                 "%s: the step's metadata does not belong to the cache's current state (built at state %llu, the cache "
                 "is at %llu): build it with this cache, apply it with gdp_cache_apply_step, then run the layers",
                 op, (unsigned long long)m->cache_generation, (unsigned long long)cache->generation);
    const int64_t T = m->padded_token_count, tp = l->shard.tp_size, cp = l->cp.cp_size, rows = local_rows(l, T);
    const int64_t multiple = l->mode == GDP_TP_MODE_SEQUENCE_PARALLEL && l->comm != NULL ? cp * tp : cp;
    if (T % cp != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: context parallelism splits the step's %lld token rows over cp = %lld ranks, which does not "
                 "divide; use buckets whose token_count is a multiple of %lld (gdp_plan_check_token_split)",
                 op, (long long)T, (long long)cp, (long long)multiple);
    if (rows < 0 && cp == 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: sequence parallel splits the step's %lld token rows over tp = %lld ranks, which does not "
                 "divide; use buckets whose token_count is a multiple of %lld",
                 op, (long long)T, (long long)tp, (long long)tp);
    if (rows < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: sequence parallel splits this CP rank's %lld token rows (the step's %lld over cp = %lld) over "
                 "tp = %lld ranks, which does not divide; use buckets whose token_count is a multiple of tp * cp = "
                 "%lld (gdp_plan_check_token_split)",
                 op, (long long)(T / cp), (long long)T, (long long)cp, (long long)tp, (long long)multiple);
    GDP_CHECK(gdp_check_tensor(op, "x", x, 2, SHAPE(rows, l->D), GDP_DT(l->res)));
    GDP_CHECK(gdp_check_contiguous(op, "x", x));
    return GDP_STATUS_SUCCESS;
}

/* Bytes of ctx workspace the CUDA chunk op needs for the step's prefill block (0 on the CPU). */
static gdp_status_t chunk_ws_bytes(const struct gdp_layer *l, const gdp_step_metadata *m, size_t *bytes) {
    *bytes = 0;
    if (l->ctx->backend == GDP_BACKEND_CPU || m->padded_prefill_count == 0 || m->prefill_rows == 0)
        return GDP_STATUS_SUCCESS;
    return gdp_chunk_get_workspace_size(m->prefill_rows, m->padded_prefill_count, (int32_t)l->M, (int32_t)l->cH,
                                        (int32_t)l->N, (int32_t)l->P, bytes);
}

/* Grows the layer's workspace to `bytes` (contents are scratch: nothing to keep) and the
 * ctx's chunk workspace to `chunk_bytes`. Only ever grows, so after the first step of the
 * largest bucket nothing is allocated (and nothing waits on the device) any more. */
static gdp_status_t grow_workspaces(struct gdp_layer *l, size_t bytes, size_t chunk_bytes) {
    if (bytes > l->ws_bytes) {
        void *ws = NULL;
        GDP_CHECK(gdp_buf_alloc(l->ctx, bytes, &ws, "the layer's workspace"));
        gdp_buf_free(l->ctx, l->ws);
        l->ws = ws;
        l->ws_bytes = bytes;
        l->ws_grows++;
    }
    return gdp_ctx_reserve_workspace(l->ctx, chunk_bytes);
}

/* Where the mixer core reads and writes a step: every row of the step (T) for the core's
 * heads. Without CP, in_proj's own output (columns z|V..|K..|Q|b..|a, pitch proj_dim) and y;
 * with CP, what the all-to-all delivered (V..|K..|Q|b..|a, pitch core_dim) and core_y. */
typedef struct core_io {
    char   *proj;     /* row 0 of the core's in_proj columns                 */
    int64_t pitch;    /* elements between rows                               */
    int64_t conv_col; /* column of the first conv channel (V_0)              */
    int64_t ba_col;   /* column of b_0 (b_0..b_{M-1} | a follow)             */
    void   *y;        /* [T, c_inner] the core's output                      */
} core_io;

/* The grouped gated RMSNorm of a step, as forward runs it (out, y, z, weight views). */
typedef struct gated_norm {
    gdp_tensor out, y, z, weight;
    int64_t group;
    double eps;
} gated_norm;

/* The decode block's cache views and its front's arguments (the conv update, then the decode
 * prepare reading the conv's output), for rows [0, pd * S) of io. */
typedef struct decode_views {
    gdp_tensor ssm, conv, draft_ssm, draft_conv, slots;
    gdp_conv1d_update_args cu;
    gdp_prepare_args pr;
} decode_views;

static gdp_status_t decode_views_make(struct gdp_layer *l, struct gdp_cache *cache, const gdp_step_metadata *m,
                                      const core_io *io, const step_ws *ws, decode_views *d) {
    const int64_t n = m->padded_decode_count, S = m->decode_tokens, M = l->M, E = S * M;
    const int64_t H = l->cH, N = l->N, P = l->P, C = l->c_conv, WT = io->pitch;
    const gdp_dtype_t a = l->act;
    const size_t es = gdp_dtype_size(a);
    char *proj = io->proj;
    memset(d, 0, sizeof *d);
    GDP_CHECK(gdp_cache_state_views(cache, l->layer_index, &d->ssm, &d->conv));
    if (S > 1 && cache->cfg.max_draft_tokens >= S)
        GDP_CHECK(gdp_cache_draft_views(cache, l->layer_index, (int32_t)S, &d->draft_ssm, &d->draft_conv));
    d->slots = view((void *)m->device.decode_slots, GDP_DTYPE_INT32, 1, SHAPE(n), NULL);
    d->cu = (gdp_conv1d_update_args){
        .x = view(proj + (size_t)io->conv_col * es, a, 3, SHAPE(n, S, C), SHAPE(S * WT, WT, 1)),
        .weight = view(l->conv_w, a, 2, SHAPE(C, l->W), NULL),
        .conv_state = d->conv,
        .conv_state_indices = d->slots,
        .intermediate_conv_states = d->draft_conv,
        .silu = 1,
        .y = view(ws->d_conv, a, 3, SHAPE(n, S, C), NULL),
    };
    d->pr = (gdp_prepare_args){
        .x = d->cu.y,
        .ba = view(proj + (size_t)io->ba_col * es, a, 3, SHAPE(n, S, l->c_ba), SHAPE(S * WT, WT, 1)),
        .A_log = view(l->A_log, GDP_DTYPE_FP32, 1, SHAPE(H), NULL),
        .dt_bias = view(l->dt_bias, a, 1, SHAPE(H), NULL),
        .num_householder = (int32_t)M, .num_heads = (int32_t)H, .num_groups = (int32_t)l->cG,
        .head_dim = (int32_t)P, .state_dim = (int32_t)N,
        .query = view(ws->d_q, a, 4, SHAPE(n, E, H, N), NULL),
        .key = view(ws->d_k, a, 4, SHAPE(n, E, H, N), NULL),
        .value = view(ws->d_v, a, 4, SHAPE(n, E, H, P), NULL),
        .beta = view(ws->d_beta, a, 3, SHAPE(n, E, H), NULL),
        .g = view(ws->d_g, GDP_DTYPE_FP32, 3, SHAPE(n, E, H), NULL),
    };
    return GDP_STATUS_SUCCESS;
}

/* The decode block: rows [0, pd * S) (d: decode_views_make's, for the same step and io). front_done:
 * in_proj ran the front already (gdp_gemm_decode_front). copy_y: gather token s of request r (o row
 * (r*S + s)*M + M-1) into y; otherwise the gated norm reads those rows of d_o in place (and with
 * norm, the decode end runs it). */
static gdp_status_t run_decode(struct gdp_layer *l, const gdp_step_metadata *m, const core_io *io, const step_ws *ws,
                               const decode_views *d, bool front_done, bool copy_y, gated_norm *norm) {
    const int64_t n = m->padded_decode_count, S = m->decode_tokens, M = l->M, E = S * M;
    const int64_t H = l->cH, P = l->P, di = l->c_inner;
    const gdp_dtype_t a = l->act;
    const size_t es = gdp_dtype_size(a);
    if (!front_done)
        GDP_CHECK(gdp_decode_conv_prepare(l->ctx, &d->cu, &d->pr)); /* one launch where it fits (decode_core.h) */

    gdp_recurrent_args rc = {
        .q = d->pr.query, .k = d->pr.key, .v = d->pr.value, .g = d->pr.g, .beta = d->pr.beta,
        .use_qk_l2norm_in_kernel = 1,
        .state = d->ssm, .state_indices = d->slots,
        .intermediate_states = d->draft_ssm,
        .steps_per_token = (int32_t)M,
        .o = view(ws->d_o, a, 4, SHAPE(n, E, H, P), NULL),
    };
    if (norm != NULL)
        return gdp_decode_recurrent_norm(l->ctx, &rc, &norm->out, &norm->y, &norm->z, &norm->weight,
                                         norm->group, norm->eps);
    GDP_CHECK(gdp_decode_recurrent_after_front(l->ctx, &rc)); /* the front is the kernel ahead */
    if (!copy_y)
        return GDP_STATUS_SUCCESS;

    /* Token s of request r reads out after its last copy: o row (r*S + s)*M + M-1. */
    return gdp_buf_copy2d(l->ctx, io->y, (size_t)di * es, (char *)ws->d_o + (size_t)(M - 1) * di * es,
                          (size_t)(M * di) * es, (size_t)di * es, (size_t)(n * S));
}

/* The prefill block: rows [prefill_token_offset, padded_token_count). Every per-request
 * copy (initial states, snapshot saves) is one launch over the padded requests, driven by
 * the metadata's device arrays: -1 entries (padding, requests that save nothing) copy
 * nothing. */
static gdp_status_t run_prefill(struct gdp_layer *l, struct gdp_cache *cache, const gdp_step_metadata *m,
                                const core_io *io, const step_ws *ws) {
    const int64_t R = m->prefill_rows, pp = m->padded_prefill_count, R0 = m->prefill_token_offset, M = l->M;
    const int64_t H = l->cH, N = l->N, P = l->P, C = l->c_conv, WT = io->pitch, di = l->c_inner;
    const gdp_dtype_t a = l->act;
    const size_t es = gdp_dtype_size(a);
    char *proj_rows = io->proj + (size_t)R0 * WT * es;
    gdp_tensor ssm, conv, snap_ssm = {0}, snap_conv = {0};
    GDP_CHECK(gdp_cache_state_views(cache, l->layer_index, &ssm, &conv));
    if (m->save_count > 0)
        GDP_CHECK(gdp_cache_snapshot_views(cache, l->layer_index, &snap_ssm, &snap_conv));
    const int64_t n_slots = cache->cfg.n_slots, n_snaps = cache->cfg.n_snapshots;
    const gdp_step_arrays *dev = &m->device;

    /* Conv windows of the snapshots: the slot's incoming window carried through the first
     * save_offset tokens of the slice, read BEFORE the slice's own conv moves the slot on. */
    if (m->save_count > 0) {
        const gdp_copy_snapshot_conv_args sc = {
            .n = pp, .channels = C, .width = (int32_t)l->W,
            .x = proj_rows + (size_t)io->conv_col * es, .x_dtype = a, .x_pitch = WT,
            .conv = conv.data, .snap_conv = snap_conv.data, .conv_dtype = conv.dtype,
            .n_slots = n_slots, .n_snapshots = n_snaps,
            .slots = dev->prefill_slots, .snapshot = dev->save_snapshot, .offset = dev->save_offset,
            .cu_seqlens = dev->cu_seqlens,
        };
        GDP_CHECK(gdp_copy_snapshot_conv(l->ctx, &sc));
    }

    /* The chunk op never reads the cache: gather each request's state as initial_state
     * (padding requests, slot -1, get zeros; they are zero-length). */
    const gdp_copy_rows_args gather = {
        .n = pp, .row_bytes = cache->ssm_bytes,
        .dst = ws->h0, .dst_idx = NULL, .dst_rows = pp,
        .src = ssm.data, .src_idx = dev->prefill_slots, .src_rows = n_slots,
        .zero_missing = 1,
    };
    GDP_CHECK(gdp_copy_rows(l->ctx, &gather));

    const gdp_tensor slots = view((void *)dev->prefill_slots, GDP_DTYPE_INT32, 1, SHAPE(pp), NULL);
    const gdp_tensor cu = view((void *)dev->cu_seqlens, GDP_DTYPE_INT32, 1, SHAPE(pp + 1), NULL);
    gdp_conv1d_varlen_args cv = {
        .x = view(proj_rows + (size_t)io->conv_col * es, a, 2, SHAPE(R, C), SHAPE(WT, 1)),
        .weight = view(l->conv_w, a, 2, SHAPE(C, l->W), NULL),
        .conv_state = conv,
        .state_indices = slots,
        .cu_seqlens = cu,
        .silu = 1,
        .y = view(ws->p_conv, a, 2, SHAPE(R, C), NULL),
    };
    gdp_prepare_args pr = {
        .x = view(ws->p_conv, a, 3, SHAPE(1, R, C), NULL),
        .ba = view(proj_rows + (size_t)io->ba_col * es, a, 3, SHAPE(1, R, l->c_ba), SHAPE(R * WT, WT, 1)),
        .A_log = view(l->A_log, GDP_DTYPE_FP32, 1, SHAPE(H), NULL),
        .dt_bias = view(l->dt_bias, a, 1, SHAPE(H), NULL),
        .num_householder = (int32_t)M, .num_heads = (int32_t)H, .num_groups = (int32_t)l->cG,
        .head_dim = (int32_t)P, .state_dim = (int32_t)N,
        .query = view(ws->p_q, a, 4, SHAPE(1, R, H, N), NULL),
        .key = view(ws->p_k, a, 4, SHAPE(1, R * M, H, N), NULL),
        .value = view(ws->p_v, a, 4, SHAPE(1, R * M, H, P), NULL),
        .beta = view(ws->p_beta, a, 3, SHAPE(1, R * M, H), NULL),
        .g = view(ws->p_g, GDP_DTYPE_FP32, 3, SHAPE(1, R, H), NULL),
    };
    /* on CUDA one pass writes q, k and v from the conv (p_conv stays unwritten; decode_core.h) */
    GDP_CHECK(gdp_prefill_conv_prepare(l->ctx, &cv, &pr));

    const int want_chunk_states = m->chunk_state_saves > 0;
    gdp_chunk_args ch = {
        .q = pr.query, .k = pr.key, .v = pr.value, .g = pr.g, .beta = pr.beta,
        .num_householder = (int32_t)M,
        .cu_seqlens = cu,
        .initial_state = view(ws->h0, ssm.dtype, 4, SHAPE(pp, H, N, P), NULL),
        .use_qk_l2norm_in_kernel = 1,
        .chunk_indices = view((void *)dev->chunk_indices, GDP_DTYPE_INT32, 2, SHAPE(m->num_chunks, 2), NULL),
        .chunk_indices_dp = view((void *)dev->chunk_indices_dp, GDP_DTYPE_INT32, 2, SHAPE(m->num_chunks_dp, 2), NULL),
        .chunk_offsets = view((void *)dev->chunk_offsets, GDP_DTYPE_INT32, 1, SHAPE(pp + 1), NULL),
        .state = ssm, .state_indices = slots,
        .return_chunk_states = want_chunk_states,
        .o = view((char *)io->y + (size_t)R0 * di * es, a, 4, SHAPE(1, R, H, P), NULL),
    };
    if (want_chunk_states)
        ch.chunk_states = view(ws->chunk_states, ssm.dtype, 4, SHAPE(m->num_chunks, H, N, P), NULL);
    GDP_CHECK(gdp_chunk_gated_delta_product_varlen(l->ctx, &ch));

    /* Snapshot states: the slot's final state (saves at a slice's end), then, for saves
     * inside a slice, the chunk state of the save point over it (save_chunk_row >= 0). */
    if (m->save_count > 0) {
        gdp_copy_rows_args save = {
            .n = pp, .row_bytes = cache->ssm_bytes,
            .dst = snap_ssm.data, .dst_idx = dev->save_snapshot, .dst_rows = n_snaps,
            .src = ssm.data, .src_idx = dev->prefill_slots, .src_rows = n_slots,
        };
        GDP_CHECK(gdp_copy_rows(l->ctx, &save));
        if (want_chunk_states) {
            save.src = ws->chunk_states;
            save.src_idx = dev->save_chunk_row;
            save.src_rows = m->num_chunks;
            GDP_CHECK(gdp_copy_rows(l->ctx, &save));
        }
    }
    return GDP_STATUS_SUCCESS;
}

/* CP, before the core: this rank's Tc rows of in_proj's sections, cut for every CP rank by
 * its heads or groups (the copies of build_cp_pack), exchanged in one all-to-all. Block j of
 * the result came from CP rank j: its rows, j * Tc .., so core_proj is the whole step's rows
 * in order, for this rank's heads. */
static gdp_status_t cp_scatter_heads(struct gdp_layer *l, int64_t Tc, const step_ws *ws) {
    const size_t es = gdp_dtype_size(l->act), block = (size_t)Tc * (size_t)l->core_dim;
    for (int32_t k = 0; k < l->n_pack; k++) {
        const cp_pack *c = &l->pack[k];
        GDP_CHECK(gdp_buf_copy2d(l->ctx, (char *)ws->cp_send + ((size_t)c->dest * block + (size_t)c->dst_col) * es,
                                 (size_t)l->core_dim * es, (char *)ws->proj + (size_t)c->src_col * es,
                                 (size_t)l->proj_dim * es, (size_t)c->width * es, (size_t)Tc));
    }
    return gdp_comm_alltoall(l->cp_comm, ws->cp_send, ws->core_proj, block, l->act, l->ctx->stream);
}

/* CP, after the core: rows j * Tc .. of core_y go back to CP rank j (one all-to-all); block j
 * received holds CP rank j's heads on this rank's rows, i.e. columns j * c_inner .. of y. */
static gdp_status_t cp_gather_heads(struct gdp_layer *l, int64_t Tc, const step_ws *ws) {
    const size_t es = gdp_dtype_size(l->act), ci = (size_t)l->c_inner, block = (size_t)Tc * ci;
    GDP_CHECK(gdp_comm_alltoall(l->cp_comm, ws->core_y, ws->cp_y, block, l->act, l->ctx->stream));
    for (int32_t j = 0; j < l->cp.cp_size; j++)
        GDP_CHECK(gdp_buf_copy2d(l->ctx, (char *)ws->y + (size_t)j * ci * es, (size_t)l->d_inner * es,
                                 (char *)ws->cp_y + (size_t)j * block * es, ci * es, ci * es, (size_t)Tc));
    return GDP_STATUS_SUCCESS;
}

/* Everything between the input and the output collective. */
static gdp_status_t run_mixer(struct gdp_layer *l, struct gdp_cache *cache, const gdp_step_metadata *m,
                              gdp_tensor *x, int64_t T_local, const step_ws *ws) {
    const int64_t T = m->padded_token_count, Tc = T / l->cp.cp_size, D = l->D, di = l->d_inner, WT = l->proj_dim;
    const gdp_dtype_t a = l->act, r = l->res;
    const size_t es = gdp_dtype_size(a);
    const gdp_tensor norm_w = view(l->norm_w, a, 1, SHAPE(D), NULL);
    const bool sp = l->mode == GDP_TP_MODE_SEQUENCE_PARALLEL && l->comm != NULL;

    /* The core's view of in_proj's output (CP: moved below, after the exchange), and the decode
     * block's views and front arguments on it. */
    core_io io = {.proj = ws->proj, .pitch = WT, .conv_col = di, .ba_col = di + l->conv_dim, .y = ws->y};
    decode_views dv;
    memset(&dv, 0, sizeof dv);
    if (m->padded_decode_count > 0 && l->cp_comm == NULL)
        GDP_CHECK(decode_views_make(l, cache, m, &io, ws, &dv));
    /* A step of one-token decode rows only, without CP or SP: in_proj may run the decode front as
     * its epilogue (gdp_gemm_decode_front; by default it does not: decode_core.h). */
    const gdp_gemm_front_args front = {.rows = Tc, .n = WT, .k = D, .A = ws->xn, .lda = D, .B = l->in_proj,
                                       .ab_dtype = a, .C = ws->proj, .ldc = WT, .conv = &dv.cu, .prep = &dv.pr};
    const bool front_in_proj = !sp && l->cp_comm == NULL && m->padded_prefill_count == 0 && m->decode_tokens == 1 &&
                               m->padded_decode_count == T && T > 0 && gdp_gemm_decode_front_fuses(l->ctx, &front);

    /* Pre-norm (x in the residual dtype, out in the activation dtype) on the rows this rank
     * holds; sequence parallel then gathers the TP group's rows (this CP rank's Tc). */
    gdp_tensor xn = view(ws->xn, a, 2, SHAPE(Tc, D), NULL);
    if (sp) {
        gdp_tensor xn_local = view(ws->xn_local, a, 2, SHAPE(T_local, D), NULL);
        GDP_CHECK(gdp_rmsnorm(l->ctx, &xn_local, x, &norm_w, l->norm_eps));
        GDP_CHECK(gdp_comm_tp_gather_input(l->comm, l->mode, ws->xn_local, ws->xn, Tc, D, a, l->ctx->stream));
        GDP_CHECK(gdp_gemm_nt_ex(l->ctx, Tc, WT, D, ws->xn, D, l->in_proj, a, 0.0f, ws->proj, WT, a));
    } else if (front_in_proj) {
        GDP_CHECK(gdp_rmsnorm(l->ctx, &xn, x, &norm_w, l->norm_eps));
        GDP_CHECK(gdp_gemm_decode_front(l->ctx, &front));
    } else { /* one op: by default the two (the one launch measured slower here: decode_core.h) */
        const gdp_norm_gemm_args in = {.out = &xn, .x = x, .weight = &norm_w, .eps = l->norm_eps,
                                       .n = WT, .B = l->in_proj, .beta = 0.0f, .C = ws->proj, .ldc = WT, .c_dtype = a};
        GDP_CHECK(gdp_norm_gemm(l->ctx, &in));
    }

    /* The core, on every row of the step for its heads. */
    if (l->cp_comm != NULL) {
        GDP_CHECK(cp_scatter_heads(l, Tc, ws));
        io = (core_io){.proj = ws->core_proj, .pitch = l->core_dim, .conv_col = 0, .ba_col = l->c_conv,
                       .y = ws->core_y};
        if (m->padded_decode_count > 0)
            GDP_CHECK(decode_views_make(l, cache, m, &io, ws, &dv));
    }
    /* A step of decode rows only (no CP): every row is a decode row, the recurrent op writes
     * 0 on padding rows, so the gated norm reads y straight from the op's output (no zero
     * fill, no gather). Otherwise rows no request owns keep y = 0 (the ops write 0 there too). */
    const bool y_in_place = l->cp_comm == NULL && m->padded_prefill_count == 0 &&
                            m->padded_decode_count * m->decode_tokens == T && T > 0;
    if (!y_in_place)
        GDP_CHECK(gdp_buf_zero(l->ctx, io.y, (size_t)(T * l->c_inner) * es));

    /* Grouped gated RMSNorm on this rank's rows and every TP-local head: the gate z is the
     * first d_inner columns of in_proj's output (it never left the rank), read in place as a
     * row view of pitch WT; y likewise from the decode op's last copies when y_in_place, and
     * then the decode block runs the norm itself (one launch with the decode op where it fits). */
    const int64_t M = l->M;
    gated_norm norm = {
        .out = view(ws->normed, a, 2, SHAPE(Tc, di), NULL),
        .y = y_in_place ? view((char *)ws->d_o + (size_t)(M - 1) * di * es, a, 2, SHAPE(Tc, di), SHAPE(M * di, 1))
                        : view(ws->y, a, 2, SHAPE(Tc, di), NULL),
        .z = view(ws->proj, a, 2, SHAPE(Tc, di), SHAPE(WT, 1)),
        .weight = view(l->out_norm_w, a, 1, SHAPE(di), NULL),
        .group = di / l->G,
        .eps = l->out_norm_eps,
    };
    /* out_proj into the residual dtype, with the residual folded in as the GEMM's C
     * (beta = 1) on exactly one place per row: rank 0's partial (all-reduce), or the row
     * block's owner (SP); the gated norm goes with it where the two are one launch
     * (decode_core.h), else with the decode op (y_in_place) or on its own. */
    const gdp_norm_gemm_args out = {.out = &norm.out, .x = &norm.y, .z = &norm.z, .weight = &norm.weight,
                                    .group_size = norm.group, .eps = norm.eps, .n = D, .B = l->out_proj,
                                    .beta = 1.0f, .C = l->comm == NULL ? x->data : ws->out, .ldc = D, .c_dtype = r};
    const bool norm_at_decode = y_in_place && !gdp_norm_gemm_fuses(l->ctx, &out);
    if (m->padded_decode_count > 0)
        GDP_CHECK(run_decode(l, m, &io, ws, &dv, front_in_proj, !y_in_place, norm_at_decode ? &norm : NULL));
    if (m->padded_prefill_count > 0 && m->prefill_rows > 0)
        GDP_CHECK(run_prefill(l, cache, m, &io, ws));
    if (l->cp_comm != NULL)
        GDP_CHECK(cp_gather_heads(l, Tc, ws));

    if (l->comm != NULL) {
        const size_t row_bytes = (size_t)D * gdp_dtype_size(r);
        GDP_CHECK(gdp_buf_zero(l->ctx, ws->out, (size_t)Tc * row_bytes));
        if (sp)
            GDP_CHECK(gdp_buf_copy(l->ctx, (char *)ws->out + (size_t)(l->shard.tp_rank * T_local) * row_bytes,
                                   x->data, (size_t)T_local * row_bytes));
        else if (l->shard.tp_rank == 0)
            GDP_CHECK(gdp_buf_copy(l->ctx, ws->out, x->data, (size_t)Tc * row_bytes));
    }
    if (norm_at_decode)
        return gdp_gemm_nt_ex(l->ctx, Tc, D, di, ws->normed, di, l->out_proj, a, 1.0f, out.C, D, r);
    return gdp_norm_gemm(l->ctx, &out);
}

/* A status agreement over every rank the layer's collectives involve: the TP group, then the
 * CP group (a failure in one TP group reaches every CP group through its own member). */
static gdp_status_t agree_all(const struct gdp_layer *l, gdp_status_t st) {
    if (l->comm != NULL)
        st = gdp_comm_agree(l->comm, st);
    if (l->cp_comm != NULL)
        st = gdp_comm_agree(l->cp_comm, st);
    return st;
}

gdp_status_t gdp_layer_forward(gdp_layer_t layer, gdp_cache_t cache, const gdp_step_metadata *meta, gdp_tensor *x) {
    static const char *op = "gdp_layer_forward";
    GDP_CHECK(check_layer(layer, op));
    /* 1. Validate, locally: nothing here talks to the device or to the other ranks. */
    gdp_status_t st = validate_pairing(layer, cache, op);
    if (st == GDP_STATUS_SUCCESS)
        st = validate_step(layer, cache, meta, x, op);

    /* 2. Workspaces, sized from the step's shape alone (the same on every rank). They only
     *    grow, which happens at the first steps of each larger bucket: the one place where
     *    the forward allocates, and so may wait on the device or fail on one rank alone. */
    const bool sized = meta != NULL && meta->step != NULL && gdp_cache_check_handle(cache, op) == GDP_STATUS_SUCCESS;
    const int64_t T_local = sized ? local_rows(layer, meta->padded_token_count) : -1;
    step_ws ws;
    memset(&ws, 0, sizeof ws);
    size_t need = 0, chunk_need = 0;
    if (sized && T_local >= 0) {
        need = plan_ws(layer, meta, cache->cfg.ssm_dtype, T_local, NULL, &ws);
        gdp_status_t cst = chunk_ws_bytes(layer, meta, &chunk_need);
        if (st == GDP_STATUS_SUCCESS)
            st = cst;
    }
    const bool grow = need > layer->ws_bytes || chunk_need > layer->ctx->workspace_bytes;
    if (st == GDP_STATUS_SUCCESS && grow)
        st = grow_workspaces(layer, need, chunk_need);

    /* 3. Agreement. The step itself was validated and agreed on by gdp_plan_build; what
     *    remains rank-local is this call's own arguments, which an SPMD program passes alike
     *    on every rank. The ranks agree only when one may fail where the others do not:
     *    the first forward of this layer with a cache (pairing), a workspace growth (memory),
     *    and every forward with GDP_PLAN_DEBUG=1. A step's steady state therefore runs the
     *    layer without any host round trip. */
    const bool multi = layer->comm != NULL || layer->cp_comm != NULL;
    /* An invalid cache handle (validation failed above) is a new pairing: never read it. */
    const bool cache_ok = gdp_cache_check_handle(cache, op) == GDP_STATUS_SUCCESS;
    const bool new_pairing = !cache_ok || layer->agreed_cache != cache->serial;
    if (multi && (grow || new_pairing || layer->debug_agree)) {
        st = agree_all(layer, st);
        if (st == GDP_STATUS_SUCCESS)
            layer->agreed_cache = cache->serial;
    }
    if (st != GDP_STATUS_SUCCESS)
        return st;
    plan_ws(layer, meta, cache->cfg.ssm_dtype, T_local, layer->ws, &ws);

    /* 4. The work, enqueued on the ctx's stream. A failure from here on (a CUDA launch, a
     *    collective) leaves the ranks apart: callers end the job (gdp_fatal). */
    st = run_mixer(layer, cache, meta, x, T_local, &ws);
    if (!multi)
        return st;
    if (layer->debug_agree) /* debug: no rank is left waiting in the collective either */
        st = agree_all(layer, st);
    if (st != GDP_STATUS_SUCCESS || layer->comm == NULL)
        return st;
    return gdp_comm_tp_reduce_output(layer->comm, layer->mode, ws.out, x->data,
                                     meta->padded_token_count / layer->cp.cp_size, layer->D, layer->res,
                                     layer->ctx->stream);
}
