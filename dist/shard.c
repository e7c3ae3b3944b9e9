/*
 * shard.c: tensor- and context-parallel shard arithmetic (config.h): the layer config's
 * defaults and validation, which heads and groups a rank owns, where every in_proj and conv
 * section lies globally and rank-locally (gdp-layer.md 1.1, 1.2, 2), the CP slicing of a TP
 * shard (the heads and groups a CP rank's mixer core runs, gdp-layer.md 3.1) and the rank
 * layout of a tp x cp job. Pure arithmetic, no communication; the checkpoint loader and the
 * layer both build on it.
 */
#include <math.h>
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
    if (!(cfg->norm_eps > 0) || !(cfg->out_norm_eps > 0) || isinf(cfg->norm_eps) || isinf(cfg->out_norm_eps))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: norm_eps = %g and out_norm_eps = %g must be finite and > 0", fn,
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

/* ---- context parallelism ---------------------------------------------------------------- */

gdp_status_t gdp_cp_shard_init(gdp_cp_shard *out, const gdp_tp_shard *tp, int32_t cp_rank, int32_t cp_size) {
    const char *fn = "gdp_cp_shard_init";
    if (out == NULL || tp == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and tp must not be NULL", fn);
    if (tp->tp_size < 1 || tp->num_in_proj_sections != 3 * tp->config.num_householder + 3 || tp->num_heads < 1 ||
        tp->num_groups < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: tp was not filled by gdp_tp_shard_init", fn);
    if (cp_size < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cp_size = %d must be >= 1", fn, cp_size);
    if (cp_rank < 0 || cp_rank >= cp_size)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cp_rank = %d is outside [0, cp_size = %d)", fn, cp_rank, cp_size);
    const int64_t Ht = tp->num_heads, Gt = tp->num_groups, cp = cp_size;
    /* Every CP rank runs whole heads, and the heads of one rank must share its group(s):
     * contiguous head blocks then line up with contiguous group blocks (or sit inside one
     * replicated group), so GQA stays h / (H_c / G_c) on every rank. */
    if (Ht % cp != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the TP shard's heads H/tp = %lld (H = %lld, tp = %d) are not divisible by cp_size = %d; each "
                 "CP rank runs H/(tp*cp) whole heads: choose cp dividing %lld",
                 fn, (long long)Ht, (long long)tp->config.num_heads, tp->tp_size, cp_size, (long long)Ht);
    if (Gt >= cp && Gt % cp != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the TP shard's groups G/tp = %lld (G = %lld, tp = %d) are >= cp_size = %d but not divisible by "
                 "it; each CP rank runs G/(tp*cp) whole groups: choose cp dividing %lld, or a multiple of it (then "
                 "consecutive CP ranks share a group)",
                 fn, (long long)Gt, (long long)tp->config.num_groups, tp->tp_size, cp_size, (long long)Gt);
    if (Gt < cp && cp % Gt != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the TP shard's groups G/tp = %lld (G = %lld, tp = %d) are fewer than cp_size = %d, so each "
                 "group is replicated on cp/(G/tp) consecutive CP ranks, which needs cp divisible by %lld; choose cp "
                 "a multiple of %lld or a divisor of it",
                 fn, (long long)Gt, (long long)tp->config.num_groups, tp->tp_size, cp_size, (long long)Gt,
                 (long long)Gt);
    gdp_cp_shard s;
    memset(&s, 0, sizeof s);
    s.tp = *tp;
    s.cp_rank = cp_rank;
    s.cp_size = cp_size;
    s.num_heads = Ht / cp;
    s.head_begin = (int64_t)cp_rank * s.num_heads;
    if (Gt >= cp) {
        s.num_groups = Gt / cp;
        s.group_repeat = 1;
        s.group_begin = (int64_t)cp_rank * s.num_groups;
    } else {
        s.num_groups = 1;
        s.group_repeat = cp / Gt;
        s.group_begin = cp_rank / s.group_repeat;
    }
    const int64_t M = tp->config.num_householder, N = tp->config.state_dim;
    s.d_inner = s.num_heads * tp->config.head_dim;
    s.conv_dim = M * s.d_inner + (M + 1) * s.num_groups * N;
    s.core_dim = s.conv_dim + (M + 1) * s.num_heads;
    *out = s;
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t check_cp_shard(const gdp_cp_shard *shard, const gdp_cp_section *out, const char *fn) {
    if (shard == NULL || out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: shard or out is NULL", fn);
    if (shard->cp_size < 1 || shard->num_heads < 1 || shard->num_groups < 1 ||
        shard->num_heads * shard->cp_size != shard->tp.num_heads)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: shard was not filled by gdp_cp_shard_init", fn);
    return GDP_STATUS_SUCCESS;
}

/* The CP slice of a TP section (core_offset is left 0 for the caller to fill). */
static void cp_slice(const gdp_cp_shard *s, const gdp_section *sec, gdp_cp_section *out) {
    memset(out, 0, sizeof *out);
    out->tp = *sec;
    switch (sec->kind) {
    case GDP_SECTION_Z: /* z is not part of the core: the gated norm reads it on the sequence shard */
        out->rows = 0;
        out->slice_begin = 0;
        break;
    case GDP_SECTION_K:
    case GDP_SECTION_Q:
        out->rows = s->num_groups * sec->unit;
        out->slice_begin = s->group_begin * sec->unit;
        break;
    default: /* V (P rows per head), b and a (one row per head) */
        out->rows = s->num_heads * sec->unit;
        out->slice_begin = s->head_begin * sec->unit;
        break;
    }
}

gdp_status_t gdp_cp_shard_in_proj_section(const gdp_cp_shard *shard, int32_t index, gdp_cp_section *out) {
    const char *fn = "gdp_cp_shard_in_proj_section";
    GDP_CHECK(check_cp_shard(shard, out, fn));
    if (index < 0 || index >= shard->tp.num_in_proj_sections)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: index %d is outside [0, 3M+3 = %d)", fn, index,
                 shard->tp.num_in_proj_sections);
    /* Core offsets are the running sums of the CP rows of the sections before this one. */
    int64_t core = 0;
    gdp_cp_section cur;
    memset(&cur, 0, sizeof cur);
    for (int32_t i = 0; i <= index; i++) {
        gdp_section sec;
        GDP_CHECK(gdp_tp_shard_in_proj_section(&shard->tp, i, &sec));
        cp_slice(shard, &sec, &cur);
        cur.core_offset = core;
        core += cur.rows;
    }
    *out = cur;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cp_shard_conv_section(const gdp_cp_shard *shard, int32_t index, gdp_cp_section *out) {
    const char *fn = "gdp_cp_shard_conv_section";
    GDP_CHECK(check_cp_shard(shard, out, fn));
    if (index < 0 || index >= shard->tp.num_conv_sections)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: index %d is outside [0, 2M+1 = %d)", fn, index,
                 shard->tp.num_conv_sections);
    /* Conv sections are in_proj sections 1 .. 2M+1; z has no core rows, so their core offsets
     * are already conv offsets. Only the TP placement is rebased (gdp_tp_shard_conv_section). */
    gdp_cp_section sec;
    GDP_CHECK(gdp_cp_shard_in_proj_section(shard, index + 1, &sec));
    GDP_CHECK(gdp_tp_shard_conv_section(&shard->tp, index, &sec.tp));
    *out = sec;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_parallel_ranks(int32_t world_rank, int32_t world_size, int32_t tp_size, int32_t *tp_rank,
                                int32_t *cp_rank, int32_t *cp_size) {
    const char *fn = "gdp_parallel_ranks";
    if (tp_rank == NULL || cp_rank == NULL || cp_size == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: tp_rank, cp_rank and cp_size must not be NULL", fn);
    if (tp_size < 1 || world_size < 1 || world_size % tp_size != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: %d ranks do not split into TP groups of tp_size = %d; start tp x cp ranks (a multiple of tp)",
                 fn, world_size, tp_size);
    if (world_rank < 0 || world_rank >= world_size)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: world_rank = %d is outside [0, %d)", fn, world_rank, world_size);
    *tp_rank = world_rank % tp_size;
    *cp_rank = world_rank / tp_size;
    *cp_size = world_size / tp_size;
    return GDP_STATUS_SUCCESS;
}
