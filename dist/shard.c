/*
 * shard.c: tensor-parallel shard arithmetic (config.h): the layer config's defaults and
 * validation, which heads and groups a rank owns, and where every in_proj and conv
 * section lies globally and rank-locally (gdp-layer.md 1.1, 1.2, 2). Pure arithmetic,
 * no communication; the checkpoint loader and the layer both build on it.
 */
#include <stdio.h>
#include <string.h>

#include "gdp/config.h"
#include "internal.h"

gdp_status_t gdp_layer_config_default(gdp_layer_config *cfg) {
    if (cfg == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_layer_config_default: cfg is NULL");
    memset(cfg, 0, sizeof *cfg);
    cfg->num_groups = 8;
    cfg->head_dim = 64;
    cfg->state_dim = 128;
    cfg->num_householder = 3;
    cfg->conv_width = 4;
    cfg->num_layers = 1;
    cfg->norm_eps = 1e-5;
    cfg->out_norm_eps = 1e-5;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_layer_config_validate(const gdp_layer_config *cfg) {
    const char *fn = "gdp_layer_config_validate";
    if (cfg == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cfg is NULL", fn);
    const struct {
        const char *name;
        int64_t     value;
    } sizes[] = {
        {"hidden_size (D)", cfg->hidden_size},         {"num_heads (H)", cfg->num_heads},
        {"num_groups (G)", cfg->num_groups},           {"head_dim (P)", cfg->head_dim},
        {"state_dim (N)", cfg->state_dim},             {"num_householder (M)", cfg->num_householder},
        {"conv_width (W)", cfg->conv_width},           {"num_layers", cfg->num_layers},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < 1)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s = %lld must be >= 1; set it in the config", fn,
                     sizes[i].name, (long long)sizes[i].value);
    if (cfg->vocab_size < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: vocab_size = %lld must be >= 0 (0 = no embedding)", fn,
                 (long long)cfg->vocab_size);
    if (cfg->num_heads % cfg->num_groups != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: num_heads H = %lld is not divisible by num_groups G = %lld; GQA needs H %% G == 0", fn,
                 (long long)cfg->num_heads, (long long)cfg->num_groups);
    if (cfg->state_dim > GDP_MAX_HEAD_DIM || cfg->head_dim > GDP_MAX_HEAD_DIM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: state_dim N = %lld and head_dim P = %lld must be <= %d", fn,
                 (long long)cfg->state_dim, (long long)cfg->head_dim, GDP_MAX_HEAD_DIM);
    if (!(cfg->norm_eps > 0) || !(cfg->out_norm_eps > 0))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: norm_eps = %g and out_norm_eps = %g must be > 0", fn,
                 cfg->norm_eps, cfg->out_norm_eps);
    /* Sizes whose products must stay well inside int64 (and the tensors inside memory). */
    const int64_t limit = (int64_t)1 << 40;
    if (cfg->hidden_size > limit || cfg->num_heads > limit / cfg->head_dim ||
        cfg->num_groups > limit / cfg->state_dim || cfg->num_householder > 4096 || cfg->conv_width > 4096)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: sizes D = %lld, H*P = %lld*%lld, G*N = %lld*%lld, M = %d, W = %d are implausibly large", fn,
                 (long long)cfg->hidden_size, (long long)cfg->num_heads, (long long)cfg->head_dim,
                 (long long)cfg->num_groups, (long long)cfg->state_dim, cfg->num_householder, cfg->conv_width);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_tp_shard_init(gdp_tp_shard *out, const gdp_layer_config *cfg, int32_t tp_rank, int32_t tp_size) {
    const char *fn = "gdp_tp_shard_init";
    if (out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out is NULL", fn);
    GDP_CHECK(gdp_layer_config_validate(cfg));
    if (tp_size < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: tp_size = %d must be >= 1", fn, tp_size);
    if (tp_rank < 0 || tp_rank >= tp_size)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: tp_rank = %d is outside [0, tp_size = %d)", fn, tp_rank,
                 tp_size);
    /* Heads and groups are split contiguously and never straddle ranks (the gated norm
     * groups and GQA need whole groups per rank), so both must divide. */
    if (cfg->num_heads % tp_size != 0 || cfg->num_groups % tp_size != 0) {
        const int64_t M = cfg->num_householder;
        const int64_t conv_channels = M * cfg->num_heads * cfg->head_dim + (M + 1) * cfg->num_groups * cfg->state_dim;
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: num_heads H = %lld and num_groups G = %lld must both be divisible by tp_size = %d "
                 "(H %% tp = %lld, G %% tp = %lld; conv channels M*H*P + (M+1)*G*N = %lld); choose a TP size "
                 "that divides both",
                 fn, (long long)cfg->num_heads, (long long)cfg->num_groups, tp_size,
                 (long long)(cfg->num_heads % tp_size), (long long)(cfg->num_groups % tp_size),
                 (long long)conv_channels);
    }
    gdp_tp_shard s;
    memset(&s, 0, sizeof s);
    s.config = *cfg;
    s.tp_rank = tp_rank;
    s.tp_size = tp_size;
    s.num_heads = cfg->num_heads / tp_size;
    s.num_groups = cfg->num_groups / tp_size;
    s.head_begin = (int64_t)tp_rank * s.num_heads;
    s.group_begin = (int64_t)tp_rank * s.num_groups;
    s.d_inner = s.num_heads * cfg->head_dim;
    const int64_t M = cfg->num_householder, gn = s.num_groups * cfg->state_dim;
    s.conv_dim = M * s.d_inner + (M + 1) * gn;
    s.in_proj_dim = s.d_inner * (1 + M) + gn * (M + 1) + s.num_heads * (M + 1);
    s.num_in_proj_sections = 3 * cfg->num_householder + 3;
    s.num_conv_sections = 2 * cfg->num_householder + 1;
    *out = s;
    return GDP_STATUS_SUCCESS;
}

/* Kind and copy of in_proj section `index` (z | V.. | K.. | Q | b.. | a). */
static void in_proj_kind(int32_t M, int32_t index, gdp_section_kind_t *kind, int32_t *copy) {
    *copy = 0;
    if (index == 0) {
        *kind = GDP_SECTION_Z;
    } else if (index <= M) {
        *kind = GDP_SECTION_V;
        *copy = index - 1;
    } else if (index <= 2 * M) {
        *kind = GDP_SECTION_K;
        *copy = index - 1 - M;
    } else if (index == 2 * M + 1) {
        *kind = GDP_SECTION_Q;
    } else if (index <= 3 * M + 1) {
        *kind = GDP_SECTION_B;
        *copy = index - 2 - 2 * M;
    } else {
        *kind = GDP_SECTION_A;
    }
}

/* Global rows, this rank's rows and where its slice starts, for a section kind: z, V, b
 * and a are split by heads, K and Q by groups. */
static void section_rows(const gdp_tp_shard *s, gdp_section_kind_t kind, gdp_section *out) {
    const gdp_layer_config *c = &s->config;
    switch (kind) {
    case GDP_SECTION_Z:
    case GDP_SECTION_V:
        out->unit = c->head_dim;
        out->global_rows = c->num_heads * c->head_dim;
        out->slice_begin = s->head_begin * c->head_dim;
        break;
    case GDP_SECTION_K:
    case GDP_SECTION_Q:
        out->unit = c->state_dim;
        out->global_rows = c->num_groups * c->state_dim;
        out->slice_begin = s->group_begin * c->state_dim;
        break;
    default: /* b, a: one row per head */
        out->unit = 1;
        out->global_rows = c->num_heads;
        out->slice_begin = s->head_begin;
        break;
    }
    out->rows = out->global_rows / s->tp_size;
}

static void section_name(gdp_section *sec) {
    static const char *const base[GDP_SECTION_NUM] = {"z", "V", "K", "Q", "b", "a"};
    if (sec->kind == GDP_SECTION_V || sec->kind == GDP_SECTION_K || sec->kind == GDP_SECTION_B)
        snprintf(sec->name, sizeof sec->name, "%s%d", base[sec->kind], sec->copy);
    else
        snprintf(sec->name, sizeof sec->name, "%s", base[sec->kind]);
}

static gdp_status_t check_shard(const gdp_tp_shard *shard, gdp_section *out, const char *fn) {
    if (shard == NULL || out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: shard or out is NULL", fn);
    if (shard->tp_size < 1 || shard->num_in_proj_sections != 3 * shard->config.num_householder + 3)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: shard was not filled by gdp_tp_shard_init", fn);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_tp_shard_in_proj_section(const gdp_tp_shard *shard, int32_t index, gdp_section *out) {
    const char *fn = "gdp_tp_shard_in_proj_section";
    GDP_CHECK(check_shard(shard, out, fn));
    if (index < 0 || index >= shard->num_in_proj_sections)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: index %d is outside [0, 3M+3 = %d)", fn, index,
                 shard->num_in_proj_sections);
    gdp_section sec;
    memset(&sec, 0, sizeof sec);
    const int32_t M = shard->config.num_householder;
    /* Offsets are the running sums of the rows of the sections before this one. */
    for (int32_t i = 0; i <= index; i++) {
        gdp_section cur;
        memset(&cur, 0, sizeof cur);
        in_proj_kind(M, i, &cur.kind, &cur.copy);
        section_rows(shard, cur.kind, &cur);
        cur.global_offset = sec.global_offset + (i > 0 ? sec.global_rows : 0);
        cur.local_offset = sec.local_offset + (i > 0 ? sec.rows : 0);
        sec = cur;
    }
    section_name(&sec);
    *out = sec;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_tp_shard_conv_section(const gdp_tp_shard *shard, int32_t index, gdp_section *out) {
    const char *fn = "gdp_tp_shard_conv_section";
    GDP_CHECK(check_shard(shard, out, fn));
    if (index < 0 || index >= shard->num_conv_sections)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: index %d is outside [0, 2M+1 = %d)", fn, index,
                 shard->num_conv_sections);
    /* Conv sections are in_proj sections 1 .. 2M+1 (V.., K.., Q), rebased past z. */
    gdp_section z, sec;
    GDP_CHECK(gdp_tp_shard_in_proj_section(shard, 0, &z));
    GDP_CHECK(gdp_tp_shard_in_proj_section(shard, index + 1, &sec));
    sec.global_offset -= z.global_rows;
    sec.local_offset -= z.rows;
    *out = sec;
    return GDP_STATUS_SUCCESS;
}
