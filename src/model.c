/*
 * model.c: a GDP language model on one tensor-parallel rank (include/gdp/model.h): the
 * layer shards of a checkpoint, the replicated token embedding (tied to the LM head) and
 * final norm; the embedding gather, the layer stack of a step, and the LM head of chosen
 * rows (final RMSNorm, then one GEMM against the embedding).
 *
 * Backend-neutral like layer.c: buffers, copies and the GEMM go through the layer's
 * primitives (backend.h: host memory and cblas_sgemm on the CPU, the CUDA runtime
 * and the layer engineer's GEMM helper on CUDA), the norm is the gdp_rmsnorm op.
 */
#include <stdio.h>
#include <string.h>

#include "gdp/model.h"
#include "gdp/sampling.h"
#include "kernels/model_kernels.h"
#include "backend.h"
#include "phase.h"

#define GDP_MODEL_MAGIC 0x67646d6du /* "gdmm" */

struct gdp_model {
    uint32_t      magic;
    gdp_ctx_t     ctx;
    gdp_comm_t    comm;
    gdp_comm_t    cp_comm;      /* NULL: cp = 1                                         */
    gdp_tp_shard  shard;        /* layer 0's shard: the config and TP-local sizes      */
    gdp_cp_shard  cp;           /* layer 0's CP shard (cp_size 1 without CP)           */
    int32_t       n_layers;
    gdp_layer_t  *layers;       /* [n_layers]                                           */
    int64_t       vocab, D;
    double        norm_eps;
    float        *embedding_host; /* [vocab, D] fp32: the gather reads it on the host   */
    void         *embedding;    /* [vocab, D] fp32 backend buffer (== host on the CPU)  */
    void         *final_norm;   /* [D] fp32 backend buffer                              */
    size_t        weight_bytes;
    /* LM-head scratch of one block: gathered rows, normed rows, logits (backend) */
    void         *rows_x, *rows_normed, *rows_logits;
    int64_t       scratch_rows;
    /* The vocab-parallel head of gdp_model_sample: this rank's rows [v0, v0 + v_local) of
     * the tied embedding (bf16 copy on CUDA; a view of the fp32 embedding on the CPU),
     * records of v_part = ceil(vocab / tp) columns per rank. */
    int32_t       tp_rank, tp_size;
    int64_t       v0, v_local;
    void         *head_w;
    int64_t       head_cap;       /* rows reserved (gdp_model_reserve_head), a block multiple */
    int32_t       head_cand;      /* candidate capacity of a record                         */
    int64_t       head_words;     /* int32 words of one row's record                        */
    void         *head_in;        /* [head_cap, D] normed rows (bf16 on CUDA, fp32 on CPU)  */
    float        *head_logits;    /* [head_cap, v_local]                                    */
    int32_t      *head_records;   /* [tp, head_cap, words] (this rank's part at tp_rank)    */
    float        *staging;      /* host staging of x for the embedding upload (CUDA)  */
    int64_t       staging_rows;
    uint32_t      magic_end;
};

static gdp_status_t check_model(const struct gdp_model *m, const char *op) {
    if (m == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: model is NULL; create it with gdp_model_init()", op);
    if (m->magic != GDP_MODEL_MAGIC || m->magic_end != GDP_MODEL_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: model %p is not a live gdp model (freed or corrupted)", op,
                 (const void *)m);
    return GDP_STATUS_SUCCESS;
}

static bool on_cpu(const struct gdp_model *m) { return m->ctx->backend == GDP_BACKEND_CPU; }

static void model_destroy(struct gdp_model *m) {
    for (int32_t l = 0; m->layers != NULL && l < m->n_layers; l++)
        gdp_layer_free(m->layers[l]);
    free(m->layers);
    if (!on_cpu(m))
        free(m->embedding_host);
    gdp_buf_free(m->ctx, m->embedding);
    gdp_buf_free(m->ctx, m->final_norm);
    gdp_buf_free(m->ctx, m->rows_x);
    gdp_buf_free(m->ctx, m->rows_normed);
    gdp_buf_free(m->ctx, m->rows_logits);
    if (!on_cpu(m))
        gdp_buf_free(m->ctx, m->head_w);
    gdp_buf_free(m->ctx, m->head_in);
    gdp_buf_free(m->ctx, m->head_logits);
    gdp_buf_free(m->ctx, m->head_records);
    free(m->staging);
    m->magic = m->magic_end = 0;
    free(m);
}

/* fp32 host copy of a weight tensor of any float dtype. */
static float *to_f32(const gdp_tensor *t, const char *what) {
    const int64_t n = gdp_tensor_numel(t);
    float *out = gdp_calloc((size_t)(n ? n : 1), sizeof(float), what);
    if (out == NULL)
        return NULL;
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)gdp_tensor_get(t, i);
    return out;
}

/* Bytes of one layer shard's weights in fp32 (as gdp_layer_init keeps them). */
static size_t layer_shard_bytes(const gdp_tp_shard *s) {
    const gdp_layer_config *c = &s->config;
    const int64_t D = c->hidden_size;
    const int64_t n = D + s->in_proj_dim * D + s->conv_dim * c->conv_width + 2 * s->num_heads + s->d_inner +
                      D * s->d_inner;
    return (size_t)n * sizeof(float);
}

/* Everything of init but the final agreement. */
static gdp_status_t model_build(struct gdp_model *m, gdp_checkpoint_t ckpt, int32_t rank, int32_t size) {
    gdp_layer_config cfg;
    GDP_CHECK(gdp_checkpoint_get_config(ckpt, &cfg));
    gdp_model_weights mw;
    memset(&mw, 0, sizeof mw);
    GDP_CHECK(gdp_checkpoint_load_model_weights(ckpt, &mw));
    gdp_status_t st = GDP_STATUS_SUCCESS;
    float *norm_host = NULL;
    m->vocab = cfg.vocab_size;
    m->D = cfg.hidden_size;
    m->norm_eps = cfg.norm_eps;
    m->n_layers = cfg.num_layers;
    m->embedding_host = to_f32(&mw.embedding, "the model's token embedding");
    norm_host = to_f32(&mw.final_norm_weight, "the model's final norm weight");
    if (m->embedding_host == NULL || norm_host == NULL) {
        st = GDP_STATUS_SYSTEM_ERROR;
        goto done;
    }
    /* The sizes come from the file: checked (a vocab of 2^59 once wrapped to a 4-byte buffer). */
    int64_t emb_elems = 0;
    size_t emb_bytes = 0;
    if (m->vocab < 1 || m->vocab > INT32_MAX || !gdp_mul_i64(m->vocab, m->D, &emb_elems) ||
        !gdp_bytes_of(emb_elems, sizeof(float), &emb_bytes)) {
        st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "gdp_model_init: vocab_size %lld x hidden_size %lld is out of "
                       "range (token ids are int32; the embedding must fit memory)", (long long)m->vocab,
                       (long long)m->D);
        goto done;
    }
    const size_t norm_bytes = (size_t)m->D * sizeof(float);
    if (on_cpu(m)) {
        m->embedding = m->embedding_host; /* one buffer serves the gather and the LM head */
    } else {
        GDP_CHECK_GOTO(gdp_buf_alloc(m->ctx, emb_bytes, &m->embedding, "the model's token embedding"), st, done);
        GDP_CHECK_GOTO(gdp_buf_upload(m->ctx, m->embedding, m->embedding_host, emb_bytes), st, done);
    }
    /* The head's slice of the vocabulary: rank r holds rows [r * ceil(V / tp), ...). */
    m->tp_rank = rank, m->tp_size = size;
    const int64_t v_part = (m->vocab + size - 1) / size;
    m->v0 = v_part * rank < m->vocab ? v_part * rank : m->vocab;
    m->v_local = m->v0 + v_part < m->vocab ? v_part : m->vocab - m->v0;
    if (m->v_local < 1) {
        st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                       "gdp_model_init: a vocabulary of %lld tokens leaves tp rank %d of %d no slice of the LM head; "
                       "use tp <= %lld", (long long)m->vocab, rank, size, (long long)m->vocab);
        goto done;
    }
    if (on_cpu(m)) {
        m->head_w = (float *)m->embedding + m->v0 * m->D;
    } else {
#ifdef GDP_HAVE_CUDA
        const size_t hb = (size_t)(m->v_local * m->D) * sizeof(uint16_t);
        GDP_CHECK_GOTO(gdp_buf_alloc(m->ctx, hb, &m->head_w, "the LM head's bf16 weight"), st, done);
        GDP_CHECK_GOTO(gdp_cuda_f32_to_bf16(m->ctx, m->head_w, (const float *)m->embedding + m->v0 * m->D,
                                            m->v_local * m->D), st, done);
        m->weight_bytes += hb;
#endif
    }
    GDP_CHECK_GOTO(gdp_buf_alloc(m->ctx, norm_bytes, &m->final_norm, "the model's final norm weight"), st, done);
    GDP_CHECK_GOTO(gdp_buf_upload(m->ctx, m->final_norm, norm_host, norm_bytes), st, done);
    m->weight_bytes += emb_bytes + norm_bytes;

    m->layers = gdp_calloc((size_t)m->n_layers, sizeof *m->layers, "the model's layer list");
    if (m->layers == NULL) {
        st = GDP_STATUS_SYSTEM_ERROR;
        goto done;
    }
    for (int32_t l = 0; l < m->n_layers && st == GDP_STATUS_SUCCESS; l++) {
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        st = gdp_checkpoint_load_layer_shard(ckpt, &w, l, rank, size);
        if (st == GDP_STATUS_SUCCESS)
            st = gdp_layer_init_cp(&m->layers[l], m->ctx, m->comm, m->cp_comm, &w, GDP_TP_MODE_ALLREDUCE);
        if (st == GDP_STATUS_SUCCESS) {
            if (l == 0) {
                m->shard = w.shard;
                st = gdp_layer_get_cp_shard(m->layers[0], &m->cp);
            }
            m->weight_bytes += layer_shard_bytes(&w.shard);
        }
        gdp_layer_weights_free(&w);
    }
done:
    free(norm_host);
    gdp_model_weights_free(&mw);
    return st;
}

gdp_status_t gdp_model_init(gdp_model_t *out, gdp_ctx_t ctx, gdp_comm_t comm, gdp_checkpoint_t ckpt) {
    return gdp_model_init_cp(out, ctx, comm, NULL, ckpt);
}

gdp_status_t gdp_model_init_cp(gdp_model_t *out, gdp_ctx_t ctx, gdp_comm_t comm, gdp_comm_t cp_comm,
                               gdp_checkpoint_t ckpt) {
    static const char *op = "gdp_model_init";
    if (out == NULL || ckpt == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and ckpt must not be NULL", op);
    *out = NULL;
    GDP_CHECK(gdp_ctx_check(ctx, op));
    int32_t rank = 0, size = 1, cp_size = 1;
    if (comm != NULL) {
        GDP_CHECK(gdp_comm_rank(comm, &rank));
        GDP_CHECK(gdp_comm_size(comm, &size));
    }
    if (cp_comm != NULL)
        GDP_CHECK(gdp_comm_size(cp_comm, &cp_size));
    struct gdp_model *m = gdp_calloc(1, sizeof *m, "gdp_model");
    gdp_status_t st = m ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    if (m != NULL) {
        m->magic = m->magic_end = GDP_MODEL_MAGIC;
        m->ctx = ctx;
        m->comm = comm;
        m->cp_comm = cp_size > 1 ? cp_comm : NULL;
        st = model_build(m, ckpt, rank, size);
    }
    /* A rank that failed (a file only it cannot read, memory) must not leave the others
     * to wait in the first step's collectives (with CP: its TP group, then its CP group). */
    if (comm != NULL)
        st = gdp_comm_agree(comm, st);
    if (cp_size > 1)
        st = gdp_comm_agree(cp_comm, st);
    if (st != GDP_STATUS_SUCCESS) {
        if (m != NULL)
            model_destroy(m);
        return st;
    }
    *out = m;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_model_free(gdp_model_t model) {
    if (model == NULL)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(check_model(model, "gdp_model_free"));
    model_destroy(model);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_model_get_shard(gdp_model_t model, gdp_tp_shard *shard) {
    GDP_CHECK(check_model(model, "gdp_model_get_shard"));
    if (shard == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_model_get_shard: shard out-pointer is NULL");
    *shard = model->shard;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_model_get_cp_shard(gdp_model_t model, gdp_cp_shard *shard) {
    GDP_CHECK(check_model(model, "gdp_model_get_cp_shard"));
    if (shard == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_model_get_cp_shard: shard out-pointer is NULL");
    *shard = model->cp;
    return GDP_STATUS_SUCCESS;
}

int64_t gdp_model_workspace_grows(const struct gdp_model *model) {
    int64_t n = model->ctx->workspace_grows;
    for (int32_t l = 0; l < model->n_layers; l++)
        n += gdp_layer_workspace_grows(model->layers[l]);
    return n;
}

gdp_status_t gdp_model_weight_bytes(gdp_model_t model, size_t *bytes) {
    GDP_CHECK(check_model(model, "gdp_model_weight_bytes"));
    if (bytes == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_model_weight_bytes: bytes out-pointer is NULL");
    *bytes = model->weight_bytes;
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t check_x(const struct gdp_model *m, const gdp_tensor *x, int64_t rows, const char *op) {
    if (x == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: x is NULL", op);
    GDP_CHECK(gdp_check_tensor(op, "x", x, 2, (const int64_t[]){rows, m->D}, GDP_DT(GDP_DTYPE_FP32)));
    return gdp_check_contiguous(op, "x", x);
}

static gdp_status_t check_embed_args(const struct gdp_model *m, const gdp_tensor *x, const int32_t *tokens,
                                     int64_t n, const char *op) {
    if (n < 0 || (n > 0 && tokens == NULL))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %lld tokens with tokens %s", op, (long long)n,
                 tokens ? "given" : "NULL");
    return check_x(m, x, n, op);
}

/* The token of row i: tokens[i], or for a reference (<= -2) the token of its record. */
static int64_t resolve_token(const int32_t *tokens, int64_t i, const gdp_sample_out *prev) {
    const int64_t t = tokens[i];
    return t <= -2 ? prev[-2 - t].token : t;
}

/* Checks every row's token (references resolved through prev, n_prev records) before
 * anything is written. */
static gdp_status_t check_tokens(const struct gdp_model *m, const int32_t *tokens, int64_t n,
                                 const gdp_sample_out *prev, int64_t n_prev, const char *op) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = tokens[i];
        if (t <= -2) {
            const int64_t h = -2 - t;
            if (prev == NULL || h >= n_prev)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: tokens[%lld] = %lld refers to sampled record %lld of the previous step, but %s; a "
                         "reference -2 - h needs 0 <= h < n_prev", op, (long long)i, (long long)t, (long long)h,
                         prev == NULL ? "no records were passed (prev is NULL)" : "only n_prev records were passed");
            if (prev[h].token < 0 || prev[h].token >= m->vocab)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: tokens[%lld] refers to sampled record %lld, whose token %d is outside [0, %lld) (the "
                         "vocabulary)", op, (long long)i, (long long)h, prev[h].token, (long long)m->vocab);
        } else if (t >= m->vocab) {
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: tokens[%lld] = %lld is outside [0, %lld) (the vocabulary; -1 = padding row, <= -2 a "
                     "reference to a sampled record)", op, (long long)i, (long long)t, (long long)m->vocab);
        }
    }
    return GDP_STATUS_SUCCESS;
}

/* The host gather (the CPU backend, and the upload path of gdp_model_embed on CUDA). */
static gdp_status_t embed_host(gdp_model_t model, gdp_tensor *x, const int32_t *tokens, int64_t n,
                               const gdp_sample_out *prev, int64_t n_prev, const char *op) {
    GDP_CHECK(check_embed_args(model, x, tokens, n, op));
    if (n_prev < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: n_prev is %lld; pass the count of prev's records (>= 0)", op,
                 (long long)n_prev);
    GDP_CHECK(check_tokens(model, tokens, n, prev, n_prev, op));
    const int64_t D = model->D;
    float *dst = (float *)x->data;
    if (!on_cpu(model)) {
        if (n > model->staging_rows) {
            float *s = gdp_calloc((size_t)(n * D), sizeof(float), "the embedding staging buffer");
            if (s == NULL)
                return GDP_STATUS_SYSTEM_ERROR;
            free(model->staging);
            model->staging = s;
            model->staging_rows = n;
        }
        dst = model->staging;
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t t = resolve_token(tokens, i, prev);
        if (t < 0)
            memset(dst + i * D, 0, sizeof(float) * (size_t)D);
        else
            memcpy(dst + i * D, model->embedding_host + t * D, sizeof(float) * (size_t)D);
    }
    if (!on_cpu(model))
        GDP_CHECK(gdp_buf_upload(model->ctx, x->data, dst, sizeof(float) * (size_t)(n * D)));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_model_embed(gdp_model_t model, gdp_tensor *x, const int32_t *tokens, int64_t n) {
    static const char *op = "gdp_model_embed";
    GDP_CHECK(check_model(model, op));
    for (int64_t i = 0; tokens != NULL && i < n; i++) /* host tokens: no references */
        if (tokens[i] < -1)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: tokens[%lld] = %d is outside [0, %lld) (the vocabulary; -1 = padding row)", op, (long long)i,
                     tokens[i], (long long)model->vocab);
    return embed_host(model, x, tokens, n, NULL, 0, op);
}

gdp_status_t gdp_model_forward(gdp_model_t model, gdp_cache_t cache, const gdp_step_metadata *meta, gdp_tensor *x) {
    GDP_CHECK(check_model(model, "gdp_model_forward"));
    if (model->cp_comm == NULL) {
        for (int32_t l = 0; l < model->n_layers; l++)
            GDP_CHECK(gdp_layer_forward(model->layers[l], cache, meta, x));
        return GDP_STATUS_SUCCESS;
    }
    /* CP: the layers run on this CP rank's block of rows (a view into x), then the blocks
     * are all-gathered in place, so x holds every row again for the LM head. */
    if (meta == NULL || x == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_model_forward: meta and x must not be NULL");
    const int64_t T = meta->padded_token_count, cp = model->cp.cp_size;
    GDP_CHECK(check_x(model, x, T, "gdp_model_forward"));
    if (T % cp != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "gdp_model_forward: the step's %lld rows do not split over cp = %lld ranks; use buckets whose "
                 "token_count is a multiple of %lld",
                 (long long)T, (long long)cp, (long long)cp);
    const int64_t Tc = T / cp;
    gdp_tensor block;
    GDP_CHECK(gdp_tensor_init(&block, (float *)x->data + (size_t)(model->cp.cp_rank * Tc * model->D),
                              GDP_DTYPE_FP32, 2, (const int64_t[]){Tc, model->D}));
    for (int32_t l = 0; l < model->n_layers; l++)
        GDP_CHECK(gdp_layer_forward(model->layers[l], cache, meta, &block));
    return gdp_comm_allgather(model->cp_comm, block.data, x->data, (size_t)(Tc * model->D), GDP_DTYPE_FP32,
                              model->ctx->stream);
}

/* The LM head runs in blocks of exactly this many rows (the last one padded): a BLAS picks
 * its kernel by the matrix sizes (OpenBLAS: a matrix-vector kernel for one row, a
 * small-matrix kernel below some size), and each kernel sums in its own order. With one
 * shape for every call, a row's logits do not depend on how many rows share its step. */
#define LM_HEAD_BLOCK 16

/* Allocates the LM-head scratch of one block on first use. */
static gdp_status_t ensure_scratch(struct gdp_model *m) {
    if (m->scratch_rows > 0)
        return GDP_STATUS_SUCCESS;
    const int64_t rows = LM_HEAD_BLOCK;
    const size_t xb = (size_t)(rows * m->D) * sizeof(float), lb = (size_t)(rows * m->vocab) * sizeof(float);
    gdp_status_t st = gdp_buf_alloc(m->ctx, xb, &m->rows_x, "the LM head's row buffer");
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_buf_alloc(m->ctx, xb, &m->rows_normed, "the LM head's normed rows");
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_buf_alloc(m->ctx, lb, &m->rows_logits, "the LM head's logits");
    if (st != GDP_STATUS_SUCCESS) {
        gdp_buf_free(m->ctx, m->rows_x);
        gdp_buf_free(m->ctx, m->rows_normed);
        m->rows_x = m->rows_normed = NULL;
        return st;
    }
    m->scratch_rows = rows;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_model_logits(gdp_model_t model, float *logits, const gdp_tensor *x, const int32_t *rows,
                              int64_t n_rows) {
    static const char *op = "gdp_model_logits";
    GDP_CHECK(check_model(model, op));
    if (logits == NULL || rows == NULL || n_rows < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: logits %s, rows %s, n_rows %lld (>= 1 needed)", op,
                 logits ? "given" : "NULL", rows ? "given" : "NULL", (long long)n_rows);
    if (x == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: x is NULL", op);
    const int64_t T = x->shape[0];
    GDP_CHECK(check_x(model, x, T, op));
    for (int64_t i = 0; i < n_rows; i++)
        if (rows[i] < 0 || rows[i] >= T)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: rows[%lld] = %d is outside [0, %lld) (x's rows)", op,
                     (long long)i, rows[i], (long long)T);
    GDP_CHECK(ensure_scratch(model));
    const int64_t D = model->D, V = model->vocab, B = LM_HEAD_BLOCK;
    const size_t row_bytes = (size_t)D * sizeof(float);
    gdp_tensor in, out, w;
    GDP_CHECK(gdp_tensor_init(&in, model->rows_x, GDP_DTYPE_FP32, 2, (const int64_t[]){B, D}));
    GDP_CHECK(gdp_tensor_init(&out, model->rows_normed, GDP_DTYPE_FP32, 2, (const int64_t[]){B, D}));
    GDP_CHECK(gdp_tensor_init(&w, model->final_norm, GDP_DTYPE_FP32, 1, (const int64_t[]){D}));
    for (int64_t first = 0; first < n_rows; first += B) {
        const int64_t n = n_rows - first < B ? n_rows - first : B;
        for (int64_t i = 0; i < B; i++) /* padding rows repeat the block's last real row */
            GDP_CHECK(gdp_buf_copy(model->ctx, (char *)model->rows_x + (size_t)i * row_bytes,
                                   (const char *)x->data + (size_t)rows[first + (i < n ? i : n - 1)] * row_bytes,
                                   row_bytes));
        GDP_CHECK(gdp_rmsnorm(model->ctx, &out, &in, &w, model->norm_eps));
        /* Tied LM head: logits[r, v] = normed[r] . embedding[v], the embedding as stored [V, D]. */
        GDP_CHECK(gdp_gemm_nt(model->ctx, B, V, D, model->rows_normed, D, model->embedding, 0.0f,
                              model->rows_logits, V, GDP_DTYPE_FP32));
        GDP_CHECK(gdp_buf_download(model->ctx, logits + first * V, model->rows_logits,
                                   (size_t)(n * V) * sizeof(float)));
    }
    return GDP_STATUS_SUCCESS;
}

/* ---- the device path of a step: embedding gather, vocab-parallel head and sampling ------ */

/* The head GEMM runs in blocks of this many rows (the last one padded), for the reason of
 * LM_HEAD_BLOCK: one GEMM shape, so a row's logits do not depend on its batch. On CUDA the
 * block is large enough that a decode step of up to 128 requests reads the head's weight
 * once (the step's floor); on the CPU the BLAS's small-matrix reasoning above holds. */
static int64_t head_block(const struct gdp_model *m) { return on_cpu(m) ? LM_HEAD_BLOCK : 128; }

gdp_status_t gdp_model_reserve_head(gdp_model_t model, int64_t max_rows, int32_t max_candidates) {
    static const char *op = "gdp_model_reserve_head";
    GDP_CHECK(check_model(model, op));
    struct gdp_model *m = model;
    if (max_rows < 1 || max_rows > (1 << 24))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: max_rows is %lld; use 1 .. 2^24", op, (long long)max_rows);
    if (max_candidates < 1 || max_candidates > GDP_SAMPLING_MAX_CANDIDATES)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: max_candidates is %d; use 1 .. %d", op, max_candidates,
                 GDP_SAMPLING_MAX_CANDIDATES);
    const int64_t B = head_block(m), cap = (max_rows + B - 1) / B * B;
    if (cap <= m->head_cap && max_candidates == m->head_cand)
        return GDP_STATUS_SUCCESS;
    const int64_t words = gdp_sample_record_words(max_candidates);
    const size_t in_bytes = (size_t)(cap * m->D) * (on_cpu(m) ? sizeof(float) : sizeof(uint16_t));
    const size_t logit_bytes = (size_t)(cap * m->v_local) * sizeof(float);
    const size_t rec_bytes = (size_t)(m->tp_size * cap * words) * sizeof(int32_t);
    void *in = NULL, *logits = NULL, *rec = NULL;
    gdp_status_t st = gdp_buf_alloc(m->ctx, in_bytes, &in, "the LM head's input rows");
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_buf_alloc(m->ctx, logit_bytes, &logits, "the LM head's logits");
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_buf_alloc(m->ctx, rec_bytes, &rec, "the sampling candidate records");
    if (st != GDP_STATUS_SUCCESS) {
        gdp_buf_free(m->ctx, in);
        gdp_buf_free(m->ctx, logits);
        return st;
    }
    gdp_buf_free(m->ctx, m->head_in);
    gdp_buf_free(m->ctx, m->head_logits);
    gdp_buf_free(m->ctx, m->head_records);
    m->head_in = in, m->head_logits = logits, m->head_records = rec;
    m->head_cap = cap, m->head_cand = max_candidates, m->head_words = words;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_model_embed_device(gdp_model_t model, gdp_tensor *x, const int32_t *tokens, int64_t n,
                                    const gdp_sample_out *prev, int64_t n_prev) {
    static const char *op = "gdp_model_embed_device";
    GDP_CHECK(check_model(model, op));
    if (on_cpu(model)) /* backend memory is host memory: the checked host gather */
        return embed_host(model, x, tokens, n, prev, n_prev, op);
    GDP_CHECK(check_embed_args(model, x, tokens, n, op));
    if (n_prev < 0 || (n_prev > 0 && prev == NULL))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: n_prev is %lld with prev %s; pass prev's record count (0 without "
                 "prev)", op, (long long)n_prev, prev ? "given" : "NULL");
#ifdef GDP_HAVE_CUDA
    const gdp_embed_gather_args a = {.x = x->data, .embedding = model->embedding, .tokens = tokens, .n = n,
                                     .D = model->D, .vocab = model->vocab, .prev = prev, .n_prev = n_prev};
    return gdp_cuda_embed_gather(model->ctx, &a);
#else
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: this libgdp was built without the CUDA backend", op);
#endif
}

/* The normed head input rows: rows[i] of x, RMSNorm, in the GEMM's dtype. */
static gdp_status_t head_rows(struct gdp_model *m, const gdp_tensor *x, const int32_t *rows, int64_t n_pad) {
    const int64_t D = m->D, T = x->shape[0];
    if (!on_cpu(m)) {
#ifdef GDP_HAVE_CUDA
        const gdp_head_rows_args a = {.out = m->head_in, .x = x->data, .rows = rows, .weight = m->final_norm,
                                      .n = n_pad, .D = D, .x_rows = T, .eps = (float)m->norm_eps};
        return gdp_cuda_head_rows(m->ctx, &a);
#endif
    }
    /* CPU: gather (a bad or padding row is zeros), then the gdp_rmsnorm op in place */
    float *in = m->head_in;
    for (int64_t i = 0; i < n_pad; i++) {
        const int32_t r = rows[i];
        if (r >= 0 && r < T)
            memcpy(in + i * D, (const float *)x->data + (int64_t)r * D, sizeof(float) * (size_t)D);
        else
            memset(in + i * D, 0, sizeof(float) * (size_t)D);
    }
    gdp_tensor t, w;
    GDP_CHECK(gdp_tensor_init(&t, in, GDP_DTYPE_FP32, 2, (const int64_t[]){n_pad, D}));
    GDP_CHECK(gdp_tensor_init(&w, m->final_norm, GDP_DTYPE_FP32, 1, (const int64_t[]){D}));
    return gdp_rmsnorm(m->ctx, &t, &t, &w, m->norm_eps);
}

static gdp_status_t model_sample(struct gdp_model *m, const gdp_model_head_args *a) {
    const int64_t B = head_block(m), n = a->n_rows, n_pad = (n + B - 1) / B * B;
    const gdp_dtype_t ab = on_cpu(m) ? GDP_DTYPE_FP32 : GDP_DTYPE_BF16;
    const size_t in_row = (size_t)m->D * (on_cpu(m) ? sizeof(float) : sizeof(uint16_t));
    /* The rows array has n entries: the padded tail of the last block keeps whatever an
     * earlier step left there. Its logits are computed and never read (the candidates take
     * n rows), and a row's logits do not depend on its neighbours in the GEMM. */
    GDP_CHECK(head_rows(m, a->x, a->rows, n));
    for (int64_t first = 0; first < n_pad; first += B)
        GDP_CHECK(gdp_gemm_nt_ex(m->ctx, B, m->v_local, m->D, (const char *)m->head_in + (size_t)first * in_row,
                                 m->D, m->head_w, ab, 0.0f, m->head_logits + first * m->v_local, m->v_local,
                                 GDP_DTYPE_FP32));
    int32_t *mine = m->head_records + (size_t)(m->tp_rank * n * m->head_words);
    const gdp_sample_candidates_args ca = {.logits = m->head_logits, .n_rows = n, .vocab_local = m->v_local,
                                           .ld = m->v_local, .vocab_offset = m->v0, .rows = a->params,
                                           .max_candidates = m->head_cand, .records = mine};
    GDP_CHECK(gdp_sample_candidates(m->ctx, &ca));
    if (m->tp_size > 1)
        GDP_CHECK(gdp_comm_allgather(m->comm, mine, m->head_records, (size_t)(n * m->head_words), GDP_DTYPE_INT32,
                                     m->ctx->stream));
    const gdp_sample_merge_args ma = {.records = m->head_records, .n_parts = m->tp_size, .n_rows = n,
                                      .max_candidates = m->head_cand, .rows = a->params, .out = a->out};
    return gdp_sample_merge(m->ctx, &ma);
}

gdp_status_t gdp_model_sample(gdp_model_t model, const gdp_model_head_args *a) {
    static const char *op = "gdp_model_sample";
    GDP_CHECK(check_model(model, op));
    if (a == NULL || a->x == NULL || a->rows == NULL || a->params == NULL || a->out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: args, x, rows, params and out must not be NULL", op);
    GDP_CHECK(check_x(model, a->x, a->x->shape[0], op));
    if (a->n_rows < 1 || a->n_rows > model->head_cap)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: n_rows is %lld; reserve the head for it first "
                 "(gdp_model_reserve_head: %lld rows reserved)", op, (long long)a->n_rows,
                 (long long)model->head_cap);
    gdp_phase_lock(model->ctx, GDP_MARK_HEAD); /* measured phases: the head and sampling as one */
    const gdp_status_t st = model_sample(model, a);
    gdp_phase_unlock(model->ctx, GDP_MARK_OPS);
    return st;
}
