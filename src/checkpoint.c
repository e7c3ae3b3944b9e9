/*
 * checkpoint.c: GDP layer checkpoints (checkpoint.h) over the safetensors reader/writer:
 * the config metadata, validation of a layer's tensors (names, shapes, dtypes,
 * divisibility by the TP size), the per-section shard loader (one pread per section
 * slice, nothing else read), and the seeded synthetic writer with Megatron's initial
 * distributions. The tensor layout is documented in checkpoint.h and docs/checkpoint.md.
 * A checkpoint with vocab_size > 0 also holds the model's token embedding (tied to the
 * LM head) and final norm, loaded whole on every rank (gdp_checkpoint_load_model_weights).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdp/checkpoint.h"
#include "internal.h"
#include "rng.h"
#include "safetensors.h"

#define GDP_CKPT_MAGIC 0x67646b70u /* "gdkp" */
#define GDP_CKPT_FORMAT "gdp-layer-checkpoint"
#define GDP_CKPT_FORMAT_VERSION "1"
#define GDP_CKPT_NAME_MAX 96

struct gdp_checkpoint {
    uint32_t         magic;
    gdp_st_file     *file;
    char            *path;
    gdp_layer_config config;
    gdp_dtype_t      dtype;
    bool             finite_check; /* loads refuse NaN / Inf weights (on unless turned off) */
    uint32_t         magic_end;
};

/* ---- metadata ---------------------------------------------------------------------- */
static gdp_status_t meta_int(gdp_st_file *f, const char *path, const char *key, bool required, int64_t dflt,
                             int64_t *out) {
    const char *text = gdp_st_metadata(f, key);
    if (text == NULL) {
        if (required)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "gdp_checkpoint_open: %s has no metadata key '%s'; it is not a gdp checkpoint (write one with "
                     "gdp-ckpt write, see docs/checkpoint.md)", path, key);
        *out = dflt;
        return GDP_STATUS_SUCCESS;
    }
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0')
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_open: %s: metadata '%s' = \"%s\" is not an integer",
                 path, key, text);
    *out = v;
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t meta_double(gdp_st_file *f, const char *path, const char *key, double dflt, double *out) {
    const char *text = gdp_st_metadata(f, key);
    if (text == NULL) {
        *out = dflt;
        return GDP_STATUS_SUCCESS;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0')
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_open: %s: metadata '%s' = \"%s\" is not a number",
                 path, key, text);
    /* strtod takes "inf" and "nan": an eps of either would make every norm output 0 or NaN. */
    if (!isfinite(v))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "gdp_checkpoint_open: %s: metadata '%s' = \"%s\" is not a finite number; give a finite value "
                 "(the eps of the norms is > 0 and small, e.g. 1e-5)",
                 path, key, text);
    *out = v;
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t parse_dtype(const char *text, gdp_dtype_t *dtype) {
    for (int d = 0; d < GDP_DTYPE_NUM; d++)
        if (d != GDP_DTYPE_INT32 && strcmp(text, gdp_dtype_name((gdp_dtype_t)d)) == 0) {
            *dtype = (gdp_dtype_t)d;
            return GDP_STATUS_SUCCESS;
        }
    return GDP_STATUS_INVALID_ARGUMENT;
}

static gdp_status_t read_config(gdp_st_file *f, const char *path, gdp_layer_config *cfg, gdp_dtype_t *dtype) {
    const char *format = gdp_st_metadata(f, "format");
    if (format != NULL && strcmp(format, GDP_CKPT_FORMAT) != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_open: %s has metadata format \"%s\", expected \"%s\"",
                 path, format, GDP_CKPT_FORMAT);
    int64_t v[8];
    static const char *const keys[8] = {"hidden_size", "num_heads",       "num_groups", "head_dim",
                                        "state_dim",   "num_householder", "conv_width", "num_layers"};
    for (int i = 0; i < 8; i++)
        GDP_CHECK(meta_int(f, path, keys[i], true, 0, &v[i]));
    for (int i = 5; i < 8; i++)
        if (v[i] < 1 || v[i] > INT32_MAX)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_open: %s: metadata %s = %lld is out of range", path,
                     keys[i], (long long)v[i]);
    gdp_layer_config c;
    gdp_layer_config_default(&c);
    c.hidden_size = v[0];
    c.num_heads = v[1];
    c.num_groups = v[2];
    c.head_dim = v[3];
    c.state_dim = v[4];
    c.num_householder = (int32_t)v[5];
    c.conv_width = (int32_t)v[6];
    c.num_layers = (int32_t)v[7];
    GDP_CHECK(meta_int(f, path, "vocab_size", false, 0, &c.vocab_size));
    /* Token ids are int32 everywhere (workloads, plans, sampling); the embedding must fit memory. */
    int64_t emb_bytes = 0;
    if (c.vocab_size < 0 || c.vocab_size > INT32_MAX || c.hidden_size < 0 ||
        !gdp_mul_i64(c.vocab_size, c.hidden_size, &emb_bytes) || !gdp_mul_i64(emb_bytes, 4, &emb_bytes))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "gdp_checkpoint_open: %s: metadata vocab_size = %lld (with hidden_size %lld) is out of range: token "
                 "ids are int32, so 0 <= vocab_size < 2^31, and vocab_size x hidden_size fp32 values must fit in "
                 "memory",
                 path, (long long)c.vocab_size, (long long)c.hidden_size);
    GDP_CHECK(meta_double(f, path, "norm_eps", 1e-5, &c.norm_eps));
    GDP_CHECK(meta_double(f, path, "out_norm_eps", 1e-5, &c.out_norm_eps));
    if (gdp_layer_config_validate(&c) != GDP_STATUS_SUCCESS) {
        char why[1024];
        snprintf(why, sizeof why, "%s", gdp_last_error());
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_open: %s holds an invalid config: %s", path, why);
    }
    const char *dt = gdp_st_metadata(f, "dtype");
    if (dt == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_open: %s has no metadata key 'dtype' (the weight "
                 "dtype: fp32, bf16 or fp16)", path);
    if (parse_dtype(dt, dtype) != GDP_STATUS_SUCCESS)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_open: %s: metadata dtype \"%s\" is not fp32, bf16 "
                 "or fp16", path, dt);
    *cfg = c;
    return GDP_STATUS_SUCCESS;
}

/* ---- open / free ------------------------------------------------------------------- */
static gdp_status_t ckpt_check(gdp_checkpoint_t ckpt, const char *fn) {
    if (ckpt == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: ckpt is NULL; open one with gdp_checkpoint_open()", fn);
    if (ckpt->magic != GDP_CKPT_MAGIC || ckpt->magic_end != GDP_CKPT_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: ckpt %p is not an open checkpoint (freed or corrupted)", fn,
                 (void *)ckpt);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_checkpoint_open(gdp_checkpoint_t *out, const char *path) {
    if (out == NULL || path == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_open: %s is NULL", out == NULL ? "out" : "path");
    *out = NULL;
    gdp_st_file *f = NULL;
    GDP_CHECK(gdp_st_open(path, &f));
    gdp_layer_config cfg;
    gdp_dtype_t dtype = GDP_DTYPE_NUM;
    gdp_status_t st = read_config(f, path, &cfg, &dtype);
    struct gdp_checkpoint *c = NULL;
    if (st == GDP_STATUS_SUCCESS) {
        c = gdp_calloc(1, sizeof *c, "a checkpoint handle");
        char *p = c ? strdup(path) : NULL;
        if (p == NULL) {
            free(c);
            st = c ? GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "gdp_checkpoint_open: out of memory") : GDP_STATUS_SYSTEM_ERROR;
            c = NULL;
        } else {
            c->path = p;
        }
    }
    if (st != GDP_STATUS_SUCCESS) {
        gdp_st_close(f);
        return st;
    }
    c->file = f;
    c->config = cfg;
    c->dtype = dtype;
    c->finite_check = true;
    c->magic = c->magic_end = GDP_CKPT_MAGIC;
    *out = c;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_checkpoint_free(gdp_checkpoint_t ckpt) {
    if (ckpt == NULL)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(ckpt_check(ckpt, "gdp_checkpoint_free"));
    gdp_st_close(ckpt->file);
    free(ckpt->path);
    ckpt->magic = ckpt->magic_end = 0;
    free(ckpt);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_checkpoint_set_finite_check(gdp_checkpoint_t ckpt, int32_t enabled) {
    GDP_CHECK(ckpt_check(ckpt, "gdp_checkpoint_set_finite_check"));
    ckpt->finite_check = enabled != 0;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_checkpoint_get_config(gdp_checkpoint_t ckpt, gdp_layer_config *cfg) {
    GDP_CHECK(ckpt_check(ckpt, "gdp_checkpoint_get_config"));
    if (cfg == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_get_config: cfg is NULL");
    *cfg = ckpt->config;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_checkpoint_get_dtype(gdp_checkpoint_t ckpt, gdp_dtype_t *dtype) {
    GDP_CHECK(ckpt_check(ckpt, "gdp_checkpoint_get_dtype"));
    if (dtype == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_checkpoint_get_dtype: dtype is NULL");
    *dtype = ckpt->dtype;
    return GDP_STATUS_SUCCESS;
}

/* ---- the tensors of a layer -------------------------------------------------------- */
/* Which tensor of a layer, in file order; in_proj and conv expand to their sections. */
typedef enum tensor_role {
    ROLE_NORM = 0,
    ROLE_IN_PROJ, /* one per in_proj section */
    ROLE_CONV,    /* one per conv section    */
    ROLE_A_LOG,
    ROLE_DT_BIAS,
    ROLE_OUT_NORM,
    ROLE_OUT_PROJ,
    ROLE_EMBEDDING,  /* model tensors (vocab_size > 0), not per layer */
    ROLE_FINAL_NORM,
} tensor_role;

typedef struct layer_tensor {
    tensor_role role;
    gdp_section section;              /* in_proj / conv only (seen from the shard's rank) */
    char        name[GDP_CKPT_NAME_MAX];
    gdp_dtype_t dtype;
    int32_t     ndim;
    int64_t     shape[2];             /* global shape */
} layer_tensor;

/* 5M + 9 tensors per layer. */
static int32_t layer_tensor_count(const gdp_layer_config *c) { return 5 * c->num_householder + 9; }

/* Lists layer `layer`'s tensors with their global shapes and dtypes; sections as seen by
 * `shard` (any rank of any valid TP size gives the same names and shapes). */
static void list_layer_tensors(const gdp_tp_shard *shard, int32_t layer, gdp_dtype_t wt, layer_tensor *t) {
    const gdp_layer_config *c = &shard->config;
    const int64_t D = c->hidden_size, HP = c->num_heads * c->head_dim;
    int32_t n = 0;
    memset(t, 0, sizeof *t * (size_t)layer_tensor_count(c));
#define ADD(role_, suffix_, dtype_, ndim_, s0_, s1_)                                                      \
    do {                                                                                                  \
        t[n].role = (role_);                                                                              \
        snprintf(t[n].name, sizeof t[n].name, "layers.%d.%s", layer, (suffix_));                          \
        t[n].dtype = (dtype_);                                                                            \
        t[n].ndim = (ndim_);                                                                              \
        t[n].shape[0] = (s0_);                                                                            \
        t[n].shape[1] = (s1_);                                                                            \
        n++;                                                                                              \
    } while (0)
    ADD(ROLE_NORM, "norm.weight", wt, 1, D, 0);
    char suffix[32];
    for (int32_t i = 0; i < shard->num_in_proj_sections; i++) {
        gdp_tp_shard_in_proj_section(shard, i, &t[n].section);
        snprintf(suffix, sizeof suffix, "in_proj.%s", t[n].section.name);
        ADD(ROLE_IN_PROJ, suffix, wt, 2, t[n].section.global_rows, D);
    }
    for (int32_t i = 0; i < shard->num_conv_sections; i++) {
        gdp_tp_shard_conv_section(shard, i, &t[n].section);
        snprintf(suffix, sizeof suffix, "conv.%s", t[n].section.name);
        ADD(ROLE_CONV, suffix, wt, 2, t[n].section.global_rows, c->conv_width);
    }
    ADD(ROLE_A_LOG, "A_log", GDP_DTYPE_FP32, 1, c->num_heads, 0);
    ADD(ROLE_DT_BIAS, "dt_bias", wt, 1, c->num_heads, 0);
    ADD(ROLE_OUT_NORM, "out_norm.weight", wt, 1, HP, 0);
    ADD(ROLE_OUT_PROJ, "out_proj", wt, 2, D, HP);
#undef ADD
}

/* The model tensors outside the layers: none when vocab_size is 0, else the token
 * embedding [vocab, D] (tied to the LM head) and the final norm weight [D]. Returns how
 * many it listed (0 or GDP_MODEL_TENSOR_COUNT). */
#define GDP_MODEL_TENSOR_COUNT 2
static int32_t list_model_tensors(const gdp_layer_config *c, gdp_dtype_t wt, layer_tensor *t) {
    if (c->vocab_size <= 0)
        return 0;
    memset(t, 0, sizeof *t * GDP_MODEL_TENSOR_COUNT);
    t[0] = (layer_tensor){.role = ROLE_EMBEDDING, .dtype = wt, .ndim = 2, .shape = {c->vocab_size, c->hidden_size}};
    snprintf(t[0].name, sizeof t[0].name, "embedding");
    t[1] = (layer_tensor){.role = ROLE_FINAL_NORM, .dtype = wt, .ndim = 1, .shape = {c->hidden_size, 0}};
    snprintf(t[1].name, sizeof t[1].name, "final_norm.weight");
    return GDP_MODEL_TENSOR_COUNT;
}

static const char *st_dtype_name(gdp_dtype_t d) {
    switch (d) {
    case GDP_DTYPE_FP32: return "F32";
    case GDP_DTYPE_BF16: return "BF16";
    case GDP_DTYPE_FP16: return "F16";
    default: return "?";
    }
}

/* Checks one tensor against the file: present, dtype, shape. */
static gdp_status_t check_tensor_in_file(const struct gdp_checkpoint *ck, const layer_tensor *t, const char *fn) {
    char want[64], got[160];
    gdp_shape_str(want, sizeof want, t->ndim, t->shape);
    const gdp_st_info *info = gdp_st_find(ck->file, t->name);
    if (info == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: %s has no tensor '%s' (expected %s %s); the checkpoint is incomplete or was written for "
                 "another config (see docs/checkpoint.md)", fn, ck->path, t->name, want, st_dtype_name(t->dtype));
    if (info->dtype != t->dtype)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s: tensor '%s' has dtype %s, expected %s%s", fn, ck->path,
                 t->name, info->st_dtype, st_dtype_name(t->dtype),
                 t->role == ROLE_A_LOG ? " (A_log is always fp32)" : " (the checkpoint's weight dtype)");
    bool same = info->ndim == t->ndim;
    for (int32_t d = 0; same && d < t->ndim; d++)
        same = info->shape[d] == t->shape[d];
    if (!same)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s: tensor '%s' has shape %s, expected %s for the config in its "
                 "metadata", fn, ck->path, t->name, gdp_shape_str(got, sizeof got, info->ndim, info->shape), want);
    return GDP_STATUS_SUCCESS;
}

/* Validates layer `layer` of the checkpoint for `shard` (nothing read but the header). */
static gdp_status_t check_layer(const struct gdp_checkpoint *ck, const gdp_tp_shard *shard, int32_t layer,
                                const char *fn, layer_tensor *tensors) {
    if (layer < 0 || layer >= ck->config.num_layers)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: layer %d is outside [0, num_layers = %d) of %s", fn, layer,
                 ck->config.num_layers, ck->path);
    list_layer_tensors(shard, layer, ck->dtype, tensors);
    for (int32_t i = 0; i < layer_tensor_count(&ck->config); i++)
        GDP_CHECK(check_tensor_in_file(ck, &tensors[i], fn));
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_checkpoint_check(gdp_checkpoint_t ckpt, int32_t tp_size) {
    const char *fn = "gdp_checkpoint_check";
    GDP_CHECK(ckpt_check(ckpt, fn));
    gdp_tp_shard shard;
    GDP_CHECK(gdp_tp_shard_init(&shard, &ckpt->config, 0, tp_size));
    layer_tensor *tensors = gdp_calloc((size_t)layer_tensor_count(&ckpt->config), sizeof *tensors, "a tensor list");
    if (tensors == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    gdp_status_t st = GDP_STATUS_SUCCESS;
    for (int32_t l = 0; st == GDP_STATUS_SUCCESS && l < ckpt->config.num_layers; l++)
        st = check_layer(ckpt, &shard, l, fn, tensors);
    free(tensors);
    layer_tensor model[GDP_MODEL_TENSOR_COUNT];
    const int32_t n_model = list_model_tensors(&ckpt->config, ckpt->dtype, model);
    for (int32_t i = 0; st == GDP_STATUS_SUCCESS && i < n_model; i++)
        st = check_tensor_in_file(ckpt, &model[i], fn);
    return st;
}

/* ---- the finite-weight check --------------------------------------------------------- */
/* Index of the first NaN or Inf among n elements of a float dtype, or -1. Bit tests: an
 * all-ones exponent is Inf or NaN in every float format. */
static int64_t first_nonfinite(const void *data, gdp_dtype_t dtype, int64_t n) {
    if (dtype == GDP_DTYPE_FP32) {
        const uint32_t *u = data;
        for (int64_t i = 0; i < n; i++)
            if ((u[i] & 0x7f800000u) == 0x7f800000u)
                return i;
    } else if (dtype == GDP_DTYPE_BF16 || dtype == GDP_DTYPE_FP16) {
        const uint16_t *u = data, mask = dtype == GDP_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
        for (int64_t i = 0; i < n; i++)
            if ((u[i] & mask) == mask)
                return i;
    }
    return -1;
}

/* A poisoned weight (NaN or Inf, e.g. from a diverged run or a broken conversion) makes every
 * logit NaN and greedy decoding emit token 0 without any error, so loads refuse it. `data`
 * holds the slice [start, start + count) of dim `dim` of tensor t (global shape); the message
 * names the tensor, the first bad element's index in the checkpoint tensor, and its value. */
static gdp_status_t check_finite(const struct gdp_checkpoint *ck, const char *fn, const layer_tensor *t,
                                 int32_t dim, int64_t start, int64_t count, const void *data) {
    if (!ck->finite_check)
        return GDP_STATUS_SUCCESS;
    int64_t local[2] = {t->shape[0], t->ndim == 2 ? t->shape[1] : 1};
    local[dim] = count;
    const int64_t bad = first_nonfinite(data, t->dtype, local[0] * local[1]);
    if (bad < 0)
        return GDP_STATUS_SUCCESS;
    int64_t index[2] = {bad / local[1], bad % local[1]};
    index[dim] += start;
    char where[64];
    if (t->ndim == 2)
        snprintf(where, sizeof where, "[%lld, %lld]", (long long)index[0], (long long)index[1]);
    else
        snprintf(where, sizeof where, "[%lld]", (long long)index[0]);
    GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
             "%s: %s: tensor '%s' holds a non-finite weight: %g at index %s (the first one this rank read); the "
             "checkpoint is corrupt (a diverged run or a broken conversion?) and would make every logit NaN. To load "
             "it anyway, skip the check: gdp_checkpoint_set_finite_check(ckpt, 0), or gdp-run --no-finite-check",
             fn, ck->path, t->name, gdp_load_elem(data, t->dtype, bad), where);
}

/* ---- the shard loader -------------------------------------------------------------- */
static gdp_status_t view(gdp_tensor *t, void *data, gdp_dtype_t dtype, int32_t ndim, int64_t s0, int64_t s1) {
    int64_t shape[2] = {s0, s1};
    return gdp_tensor_init(t, data, dtype, ndim, shape);
}

gdp_status_t gdp_layer_weights_free(gdp_layer_weights *w) {
    if (w == NULL)
        return GDP_STATUS_SUCCESS;
    free(w->norm_weight.data);
    free(w->in_proj.data);
    free(w->conv.data);
    free(w->A_log.data);
    free(w->dt_bias.data);
    free(w->out_norm_weight.data);
    free(w->out_proj.data);
    memset(w, 0, sizeof *w);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_checkpoint_load_layer_shard(gdp_checkpoint_t ckpt, gdp_layer_weights *out, int32_t layer,
                                             int32_t tp_rank, int32_t tp_size) {
    const char *fn = "gdp_checkpoint_load_layer_shard";
    GDP_CHECK(ckpt_check(ckpt, fn));
    if (out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out is NULL", fn);
    /* 1. Validate everything (shard arithmetic, then every tensor's name, shape, dtype). */
    gdp_tp_shard shard;
    GDP_CHECK(gdp_tp_shard_init(&shard, &ckpt->config, tp_rank, tp_size));
    const int32_t count = layer_tensor_count(&ckpt->config);
    layer_tensor tensors_stack[64];
    layer_tensor *tensors = count <= 64 ? tensors_stack : gdp_calloc((size_t)count, sizeof *tensors, "a tensor list");
    if (tensors == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    gdp_status_t st = check_layer(ckpt, &shard, layer, fn, tensors);
    if (st != GDP_STATUS_SUCCESS) {
        if (tensors != tensors_stack)
            free(tensors);
        return st;
    }

    /* 2. Allocate this rank's buffers into a local struct (out is untouched until the end). */
    const gdp_layer_config *c = &ckpt->config;
    const gdp_dtype_t wt = ckpt->dtype;
    const size_t es = gdp_dtype_size(wt);
    const int64_t D = c->hidden_size, Ht = shard.num_heads, dt = shard.d_inner;
    gdp_layer_weights w;
    memset(&w, 0, sizeof w);
    w.shard = shard;
    w.layer = layer;
    w.dtype = wt;
    struct {
        gdp_tensor *t;
        gdp_dtype_t dtype;
        int32_t     ndim;
        int64_t     s0, s1;
        const char *what;
    } bufs[] = {
        {&w.norm_weight, wt, 1, D, 1, "norm.weight"},
        {&w.in_proj, wt, 2, shard.in_proj_dim, D, "in_proj"},
        {&w.conv, wt, 2, shard.conv_dim, c->conv_width, "conv"},
        {&w.A_log, GDP_DTYPE_FP32, 1, Ht, 1, "A_log"},
        {&w.dt_bias, wt, 1, Ht, 1, "dt_bias"},
        {&w.out_norm_weight, wt, 1, dt, 1, "out_norm.weight"},
        {&w.out_proj, wt, 2, D, dt, "out_proj"},
    };
    for (size_t i = 0; st == GDP_STATUS_SUCCESS && i < sizeof bufs / sizeof bufs[0]; i++) {
        /* Bounded by the file (every tensor was found with this shape), checked all the same. */
        int64_t n = 0;
        size_t bytes = 0;
        if (!gdp_mul_i64(bufs[i].s0, bufs[i].s1, &n) || !gdp_bytes_of(n, gdp_dtype_size(bufs[i].dtype), &bytes)) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "%s: %s: the %s shard [%lld, %lld] overflows 64 bits", fn,
                           ckpt->path, bufs[i].what, (long long)bufs[i].s0, (long long)bufs[i].s1);
            break;
        }
        void *p = gdp_calloc((size_t)n, gdp_dtype_size(bufs[i].dtype), bufs[i].what);
        if (p == NULL) {
            st = GDP_STATUS_SYSTEM_ERROR;
            break;
        }
        st = view(bufs[i].t, p, bufs[i].dtype, bufs[i].ndim, bufs[i].s0, bufs[i].s1);
        if (st != GDP_STATUS_SUCCESS)
            free(p);
    }

    /* 3. Read each section's slice (and the head slices) straight into place. */
    for (int32_t i = 0; st == GDP_STATUS_SUCCESS && i < count; i++) {
        const layer_tensor *t = &tensors[i];
        const gdp_section *s = &t->section;
        switch (t->role) {
        case ROLE_NORM:
            st = gdp_st_read(ckpt->file, t->name, w.norm_weight.data, (size_t)D * es);
            if (st == GDP_STATUS_SUCCESS)
                st = check_finite(ckpt, fn, t, 0, 0, D, w.norm_weight.data);
            break;
        case ROLE_IN_PROJ: {
            char *dst = (char *)w.in_proj.data + (size_t)(s->local_offset * D) * es;
            st = gdp_st_read_slice(ckpt->file, t->name, 0, s->slice_begin, s->rows, dst, (size_t)(s->rows * D) * es);
            if (st == GDP_STATUS_SUCCESS)
                st = check_finite(ckpt, fn, t, 0, s->slice_begin, s->rows, dst);
            break;
        }
        case ROLE_CONV: {
            char *dst = (char *)w.conv.data + (size_t)(s->local_offset * c->conv_width) * es;
            st = gdp_st_read_slice(ckpt->file, t->name, 0, s->slice_begin, s->rows, dst,
                                   (size_t)(s->rows * c->conv_width) * es);
            if (st == GDP_STATUS_SUCCESS)
                st = check_finite(ckpt, fn, t, 0, s->slice_begin, s->rows, dst);
            break;
        }
        case ROLE_A_LOG:
            st = gdp_st_read_slice(ckpt->file, t->name, 0, shard.head_begin, Ht, w.A_log.data, (size_t)Ht * 4);
            if (st == GDP_STATUS_SUCCESS)
                st = check_finite(ckpt, fn, t, 0, shard.head_begin, Ht, w.A_log.data);
            break;
        case ROLE_DT_BIAS:
            st = gdp_st_read_slice(ckpt->file, t->name, 0, shard.head_begin, Ht, w.dt_bias.data, (size_t)Ht * es);
            if (st == GDP_STATUS_SUCCESS)
                st = check_finite(ckpt, fn, t, 0, shard.head_begin, Ht, w.dt_bias.data);
            break;
        case ROLE_OUT_NORM:
            st = gdp_st_read_slice(ckpt->file, t->name, 0, shard.head_begin * c->head_dim, dt, w.out_norm_weight.data,
                                   (size_t)dt * es);
            if (st == GDP_STATUS_SUCCESS)
                st = check_finite(ckpt, fn, t, 0, shard.head_begin * c->head_dim, dt, w.out_norm_weight.data);
            break;
        case ROLE_OUT_PROJ: /* row-parallel: this rank's input columns, for every output row */
            st = gdp_st_read_slice(ckpt->file, t->name, 1, shard.head_begin * c->head_dim, dt, w.out_proj.data,
                                   (size_t)(D * dt) * es);
            if (st == GDP_STATUS_SUCCESS)
                st = check_finite(ckpt, fn, t, 1, shard.head_begin * c->head_dim, dt, w.out_proj.data);
            break;
        case ROLE_EMBEDDING:
        case ROLE_FINAL_NORM: /* model tensors: gdp_checkpoint_load_model_weights */
            break;
        }
    }
    if (tensors != tensors_stack)
        free(tensors);
    if (st != GDP_STATUS_SUCCESS) {
        gdp_layer_weights_free(&w);
        return st;
    }
    *out = w;
    return GDP_STATUS_SUCCESS;
}

/* ---- the model tensors (embedding, final norm) ----------------------------------------- */
gdp_status_t gdp_model_weights_free(gdp_model_weights *w) {
    if (w == NULL)
        return GDP_STATUS_SUCCESS;
    free(w->embedding.data);
    free(w->final_norm_weight.data);
    memset(w, 0, sizeof *w);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_checkpoint_load_model_weights(gdp_checkpoint_t ckpt, gdp_model_weights *out) {
    const char *fn = "gdp_checkpoint_load_model_weights";
    GDP_CHECK(ckpt_check(ckpt, fn));
    if (out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out is NULL", fn);
    const gdp_layer_config *c = &ckpt->config;
    if (c->vocab_size <= 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: %s has vocab_size 0: it holds GDP layers but no token embedding; write a checkpoint with a "
                 "vocabulary (gdp_checkpoint_write_synthetic with cfg.vocab_size > 0, or gdp-run --write-model)",
                 fn, ckpt->path);
    layer_tensor t[GDP_MODEL_TENSOR_COUNT];
    list_model_tensors(c, ckpt->dtype, t);
    for (int32_t i = 0; i < GDP_MODEL_TENSOR_COUNT; i++)
        GDP_CHECK(check_tensor_in_file(ckpt, &t[i], fn));
    const size_t es = gdp_dtype_size(ckpt->dtype);
    const size_t n_emb = (size_t)(c->vocab_size * c->hidden_size), n_norm = (size_t)c->hidden_size;
    gdp_model_weights w;
    memset(&w, 0, sizeof w);
    w.dtype = ckpt->dtype;
    void *emb = gdp_calloc(n_emb, es, "the token embedding");
    void *norm = emb ? gdp_calloc(n_norm, es, "the final norm weight") : NULL;
    gdp_status_t st = norm ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    if (st == GDP_STATUS_SUCCESS)
        st = view(&w.embedding, emb, ckpt->dtype, 2, c->vocab_size, c->hidden_size);
    if (st == GDP_STATUS_SUCCESS)
        st = view(&w.final_norm_weight, norm, ckpt->dtype, 1, c->hidden_size, 1);
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_st_read(ckpt->file, t[0].name, emb, n_emb * es);
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_st_read(ckpt->file, t[1].name, norm, n_norm * es);
    if (st == GDP_STATUS_SUCCESS)
        st = check_finite(ckpt, fn, &t[0], 0, 0, c->vocab_size, emb);
    if (st == GDP_STATUS_SUCCESS)
        st = check_finite(ckpt, fn, &t[1], 0, 0, c->hidden_size, norm);
    if (st != GDP_STATUS_SUCCESS) {
        free(emb);
        free(norm);
        return st;
    }
    *out = w;
    return GDP_STATUS_SUCCESS;
}

/* ---- the synthetic writer ---------------------------------------------------------- */
/* splitmix64 (rng.h): small, seedable, and good enough for initial weights. */
typedef struct ckpt_rng {
    uint64_t state;
} ckpt_rng;

static uint64_t rng_next(ckpt_rng *r) { return gdp_splitmix64_next(&r->state); }

/* Uniform on the open interval (0, 1): never 0, so log() of it is finite. */
static double rng_open01(ckpt_rng *r) { return gdp_splitmix64_open01(&r->state); }

static double rng_normal(ckpt_rng *r) {
    const double two_pi = 6.283185307179586476925286766559;
    return sqrt(-2.0 * log(rng_open01(r))) * cos(two_pi * rng_open01(r));
}

/* Each tensor gets its own stream from (seed, name), so values do not depend on the order
 * tensors are generated in. */
static void rng_for_tensor(ckpt_rng *r, uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    r->state = seed ^ (h * GDP_SPLITMIX64_GAMMA);
    (void)rng_next(r);
}

static void fill_tensor(void *data, gdp_dtype_t dtype, int64_t n, tensor_role role, const gdp_layer_config *c,
                        ckpt_rng *r) {
    const double in_std = 0.02, out_std = 0.02 / sqrt(2.0 * c->num_layers);
    /* The token embedding is tied to the LM head. At Megatron's 0.02 a random model's logits
     * favour the input token by ~10 sigma over the rest (its own embedding outweighs the
     * small residual updates of random layers), so greedy decoding only repeats the last
     * token. A quarter of that lets the layers' outputs decide the next token. */
    const double emb_std = 0.005;
    const double conv_bound = 1.0 / sqrt((double)c->conv_width);
    const double log_dt_min = log(1e-3), log_dt_max = log(0.1), dt_floor = 1e-4;
    for (int64_t i = 0; i < n; i++) {
        double v = 0.0;
        switch (role) {
        case ROLE_NORM:
        case ROLE_OUT_NORM:
        case ROLE_FINAL_NORM: v = 1.0; break;
        case ROLE_IN_PROJ: v = in_std * rng_normal(r); break;
        case ROLE_EMBEDDING: v = emb_std * rng_normal(r); break;
        case ROLE_OUT_PROJ: v = out_std * rng_normal(r); break;
        case ROLE_CONV: v = conv_bound * (2.0 * rng_open01(r) - 1.0); break;
        case ROLE_A_LOG: v = log(16.0 * rng_open01(r)); break;
        case ROLE_DT_BIAS: {
            double dt = exp(log_dt_min + (log_dt_max - log_dt_min) * rng_open01(r));
            dt = dt < dt_floor ? dt_floor : dt;
            v = dt + log(-expm1(-dt)); /* softplus^-1(dt) = log(exp(dt) - 1) */
            break;
        }
        }
        gdp_store_elem(data, dtype, i, v);
    }
}

gdp_status_t gdp_checkpoint_write_synthetic(const char *path, const gdp_layer_config *cfg, uint64_t seed,
                                            gdp_dtype_t dtype) {
    const char *fn = "gdp_checkpoint_write_synthetic";
    if (path == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: path is NULL", fn);
    GDP_CHECK(gdp_layer_config_validate(cfg));
    if (dtype != GDP_DTYPE_FP32 && dtype != GDP_DTYPE_BF16 && dtype != GDP_DTYPE_FP16)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: dtype %s is not a weight dtype; use fp32, bf16 or fp16", fn,
                 gdp_dtype_name(dtype));
    gdp_tp_shard shard;
    GDP_CHECK(gdp_tp_shard_init(&shard, cfg, 0, 1));
    const int32_t per_layer = layer_tensor_count(cfg);
    const size_t layer_total = (size_t)per_layer * (size_t)cfg->num_layers;
    const size_t total = layer_total + (cfg->vocab_size > 0 ? GDP_MODEL_TENSOR_COUNT : 0);
    layer_tensor *tensors = gdp_calloc(total, sizeof *tensors, "the synthetic tensor list");
    gdp_st_entry *entries = gdp_calloc(total, sizeof *entries, "the synthetic entry list");
    gdp_status_t st = (tensors && entries) ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    size_t n = 0;
    if (st == GDP_STATUS_SUCCESS)
        list_model_tensors(cfg, dtype, &tensors[layer_total]);
    for (int32_t l = 0; st == GDP_STATUS_SUCCESS && l <= cfg->num_layers; l++) {
        /* every layer's tensors, then (pass l == num_layers) the model's, if any */
        const int32_t count = l < cfg->num_layers ? per_layer : (int32_t)(total - layer_total);
        if (l < cfg->num_layers)
            list_layer_tensors(&shard, l, dtype, &tensors[(size_t)l * (size_t)per_layer]);
        for (int32_t i = 0; i < count; i++, n++) {
            layer_tensor *t = &tensors[n];
            int64_t numel = 0;
            size_t bytes = 0;
            if (!gdp_mul_i64(t->shape[0], t->ndim == 2 ? t->shape[1] : 1, &numel) ||
                !gdp_bytes_of(numel, gdp_dtype_size(t->dtype), &bytes)) {
                st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "%s: tensor '%s' of [%lld, %lld] overflows 64 bits; the "
                               "config is too large", fn, t->name, (long long)t->shape[0], (long long)t->shape[1]);
                break;
            }
            void *data = gdp_calloc((size_t)numel, gdp_dtype_size(t->dtype), t->name);
            if (data == NULL) {
                st = GDP_STATUS_SYSTEM_ERROR;
                break;
            }
            ckpt_rng r;
            rng_for_tensor(&r, seed, t->name);
            fill_tensor(data, t->dtype, numel, t->role, cfg, &r);
            entries[n] = (gdp_st_entry){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = data};
            entries[n].shape[0] = t->shape[0];
            entries[n].shape[1] = t->shape[1];
        }
    }
    if (st == GDP_STATUS_SUCCESS) {
        char num[11][40], json[1024];
        snprintf(num[0], sizeof num[0], "%lld", (long long)cfg->hidden_size);
        snprintf(num[1], sizeof num[1], "%lld", (long long)cfg->num_heads);
        snprintf(num[2], sizeof num[2], "%lld", (long long)cfg->num_groups);
        snprintf(num[3], sizeof num[3], "%lld", (long long)cfg->head_dim);
        snprintf(num[4], sizeof num[4], "%lld", (long long)cfg->state_dim);
        snprintf(num[5], sizeof num[5], "%d", cfg->num_householder);
        snprintf(num[6], sizeof num[6], "%d", cfg->conv_width);
        snprintf(num[7], sizeof num[7], "%d", cfg->num_layers);
        snprintf(num[8], sizeof num[8], "%lld", (long long)cfg->vocab_size);
        snprintf(num[9], sizeof num[9], "%.17g", cfg->norm_eps);
        snprintf(num[10], sizeof num[10], "%.17g", cfg->out_norm_eps);
        char seed_text[32];
        snprintf(seed_text, sizeof seed_text, "%llu", (unsigned long long)seed);
        snprintf(json, sizeof json,
                 "{\"hidden_size\": %s, \"num_heads\": %s, \"num_groups\": %s, \"head_dim\": %s, \"state_dim\": %s, "
                 "\"num_householder\": %s, \"conv_width\": %s, \"num_layers\": %s, \"vocab_size\": %s, "
                 "\"norm_eps\": %s, \"out_norm_eps\": %s, \"dtype\": \"%s\"}",
                 num[0], num[1], num[2], num[3], num[4], num[5], num[6], num[7], num[8], num[9], num[10],
                 gdp_dtype_name(dtype));
        const char *keys[] = {"format",       "format_version", "hidden_size", "num_heads",   "num_groups",
                              "head_dim",     "state_dim",      "num_householder", "conv_width", "num_layers",
                              "vocab_size",   "norm_eps",       "out_norm_eps", "dtype",       "seed",
                              "init",         "config"};
        const char *values[] = {GDP_CKPT_FORMAT, GDP_CKPT_FORMAT_VERSION, num[0], num[1], num[2], num[3], num[4],
                                num[5], num[6], num[7], num[8], num[9], num[10], gdp_dtype_name(dtype), seed_text,
                                "synthetic: in_proj N(0,0.02), out_proj N(0,0.02/sqrt(2L)), conv U(+-1/sqrt(W)), "
                                "A_log log U(0,16), dt_bias softplus^-1(logU[1e-3,0.1] floor 1e-4), norms 1",
                                json};
        st = gdp_st_write(path, entries, (int32_t)total, keys, values, (int32_t)(sizeof keys / sizeof keys[0]));
    }
    for (size_t i = 0; entries && i < total; i++)
        free((void *)entries[i].data);
    free(entries);
    free(tensors);
    return st;
}
