/*
 * config.h: the plain description of a GDP layer stack (gdp_layer_config) and the
 * tensor-parallel shard arithmetic over it (gdp_tp_shard, gdp_section): which heads and
 * groups rank r of tp owns, and where each of the 3M+3 in_proj sections and 2M+1 conv
 * sections lies in the global (TP = 1) tensors and in the rank-local fused tensors; and the
 * context-parallel slicing of a TP shard (gdp_cp_shard: the heads and groups a CP rank's mixer
 * core runs, gdp-layer.md 3.1) with the rank layout of a tp x cp job.
 * ../shared/docs/gdp-layer.md sections 1.1, 1.2, 2 and 3.1 define the layout; docs/checkpoint.md
 * shows it on an example, docs/cp.md the CP slicing. Implemented in dist/shard.c.
 */
#ifndef GDP_CONFIG_H
#define GDP_CONFIG_H

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One GDP layer stack. Symbols as in gdp-layer.md (Megatron field in brackets). */
typedef struct gdp_layer_config {
    int64_t hidden_size;     /* D [hidden_size]                                    */
    int64_t num_heads;       /* H, value heads [mamba_num_heads]                   */
    int64_t num_groups;      /* G, key/query groups [mamba_num_groups]; H % G == 0 */
    int64_t head_dim;        /* P, value head dim [mamba_head_dim]                 */
    int64_t state_dim;       /* N, key/query head dim [mamba_state_dim]; <= 256    */
    int32_t num_householder; /* M >= 1 [gdp_num_householder]                       */
    int32_t conv_width;      /* W, conv kernel width [d_conv], 4                   */
    int32_t num_layers;      /* GDP layers in the stack (>= 1)                     */
    int64_t vocab_size;      /* 0 when the stack has no embedding                  */
    double  norm_eps;        /* eps of the pre-norm RMSNorm fused into in_proj, 1e-5 */
    double  out_norm_eps;    /* eps of the grouped gated RMSNorm, 1e-5             */
} gdp_layer_config;

/* Megatron's defaults: G = 8, P = 64, N = 128, M = 3, W = 4, one layer, eps 1e-5, no
 * vocabulary; hidden_size and num_heads are 0 (they have no default: set them). */
GDP_API gdp_status_t gdp_layer_config_default(gdp_layer_config *cfg);
/* INVALID_ARGUMENT naming the field and value unless every size is positive, H % G == 0,
 * N <= 256 and both eps are positive. */
GDP_API gdp_status_t gdp_layer_config_validate(const gdp_layer_config *cfg);

/* in_proj's 3M+3 sections in semantic order z | V_0..V_{M-1} | K_0..K_{M-1} | Q |
 * b_0..b_{M-1} | a; conv's 2M+1 sections are V_0..V_{M-1} | K_0..K_{M-1} | Q. */
typedef enum gdp_section_kind {
    GDP_SECTION_Z = 0, /* output gate, H*P rows (head, then p)          */
    GDP_SECTION_V,     /* values of copy m, H*P rows (head, then p)     */
    GDP_SECTION_K,     /* keys of copy m, G*N rows (group, then n)      */
    GDP_SECTION_Q,     /* query, G*N rows (group, then n)               */
    GDP_SECTION_B,     /* pre-sigmoid beta of copy m, H rows            */
    GDP_SECTION_A,     /* pre-softplus decay input, H rows              */
    GDP_SECTION_NUM    /* must be last */
} gdp_section_kind_t;

/* One section of a fused tensor (rows = the sharded dim 0), seen from one rank. */
typedef struct gdp_section {
    gdp_section_kind_t kind;
    int32_t copy;          /* Householder copy m of V, K, b; 0 for z, Q, a                  */
    char    name[12];      /* "z", "V0", "K2", "Q", "b1", "a": the checkpoint name suffix  */
    int64_t unit;          /* rows per head (P for z/V, 1 for b/a) or per group (N for K/Q) */
    int64_t global_rows;   /* rows at TP = 1                                               */
    int64_t global_offset; /* first row of the section in the global fused tensor          */
    int64_t rows;          /* rows this rank holds = global_rows / tp                      */
    int64_t slice_begin;   /* first row of this rank's slice inside the global section     */
    int64_t local_offset;  /* first row of the section in the rank-local fused tensor      */
} gdp_section;

/* Rank tp_rank's share of a layer at tensor-parallel size tp_size. */
typedef struct gdp_tp_shard {
    gdp_layer_config config;   /* the global config (copied)                    */
    int32_t tp_rank, tp_size;
    int64_t num_heads;         /* H_t = H / tp                                  */
    int64_t num_groups;        /* G_t = G / tp                                  */
    int64_t head_begin;        /* first global head: tp_rank * H_t              */
    int64_t group_begin;       /* first global group: tp_rank * G_t             */
    int64_t d_inner;           /* d_t = H_t * P                                 */
    int64_t conv_dim;          /* M*d_t + (M+1)*G_t*N (the VKQ channels)        */
    int64_t in_proj_dim;       /* d_t*(1+M) + G_t*N*(M+1) + H_t*(M+1)           */
    int32_t num_in_proj_sections; /* 3M+3 */
    int32_t num_conv_sections;    /* 2M+1 */
} gdp_tp_shard;

/* Fills *out for rank tp_rank of tp_size. Errors (out untouched): the config's own
 * (gdp_layer_config_validate), tp_size < 1, tp_rank outside [0, tp_size), or H, G (and
 * so the conv channels M*H*P + (M+1)*G*N) not divisible by tp_size: INVALID_ARGUMENT
 * naming the numbers, e.g. "num_heads H = 6 is not divisible by tp_size = 4". */
GDP_API gdp_status_t gdp_tp_shard_init(gdp_tp_shard *out, const gdp_layer_config *cfg, int32_t tp_rank,
                                       int32_t tp_size);
/* Section `index` in [0, 3M+3) of in_proj / [0, 2M+1) of conv, in semantic order.
 * INVALID_ARGUMENT for an index out of range. */
GDP_API gdp_status_t gdp_tp_shard_in_proj_section(const gdp_tp_shard *shard, int32_t index, gdp_section *out);
GDP_API gdp_status_t gdp_tp_shard_conv_section(const gdp_tp_shard *shard, int32_t index, gdp_section *out);

/* ---- context parallelism (gdp-layer.md 3.1, headwise all-to-all; ../../docs/cp.md) -------
 * A job of world = tp * cp ranks: rank = tp_rank + tp * cp_rank, so the tp ranks of a TP
 * group are consecutive and a CP group holds the ranks with the same tp_rank. Outside the
 * mixer core the sequence is sharded over the CP group (CP rank c holds the c-th contiguous
 * 1/cp of every step's padded token rows); the core (conv, prepare, recurrence) runs on the
 * whole sequence for the CP rank's share of the TP shard's heads and groups. */

/* Rank cp_rank's share of a TP shard at context-parallel size cp_size: the heads and groups
 * its mixer core runs. Heads are split contiguously (H_c = H_t / cp each). Groups: with
 * G_t >= cp, G_c = G_t / cp contiguous groups each; with G_t < cp, each group is replicated
 * on cp / G_t consecutive CP ranks, which run one group (G_c = 1). Either way a CP rank's
 * heads use exactly its groups (GQA head h -> group h / (H_c / G_c)). */
typedef struct gdp_cp_shard {
    gdp_tp_shard tp;         /* the TP shard it slices (copied)                              */
    int32_t cp_rank, cp_size;
    int64_t num_heads;       /* H_c = H_t / cp                                               */
    int64_t num_groups;      /* G_c = G_t / cp, or 1 when G_t < cp                           */
    int64_t group_repeat;    /* CP ranks sharing each group: cp / G_t when G_t < cp, else 1  */
    int64_t head_begin;      /* first head inside the TP shard: cp_rank * H_c                */
    int64_t group_begin;     /* first group inside the TP shard: cp_rank * G_c, or
                                cp_rank / group_repeat when groups are replicated            */
    int64_t d_inner;         /* d_c = H_c * P                                                */
    int64_t conv_dim;        /* M*d_c + (M+1)*G_c*N: the core's conv channels (V..|K..|Q)    */
    int64_t core_dim;        /* conv_dim + (M+1)*H_c: the core's in_proj columns per token,
                                V_0..|K_0..|Q|b_0..|a (z stays with the sequence shard)      */
} gdp_cp_shard;

/* Fills *out for CP rank cp_rank of cp_size over *tp (from gdp_tp_shard_init). cp_size = 1
 * gives the TP shard itself (H_c = H_t, ...). Errors (out untouched), INVALID_ARGUMENT naming
 * the numbers: cp_size < 1, cp_rank outside [0, cp_size), H/tp not divisible by cp, G/tp >= cp
 * but not divisible by cp, or G/tp < cp and cp not divisible by G/tp. */
GDP_API gdp_status_t gdp_cp_shard_init(gdp_cp_shard *out, const gdp_tp_shard *tp, int32_t cp_rank,
                                       int32_t cp_size);

/* One in_proj (or conv) section as the CP shard sees it. */
typedef struct gdp_cp_section {
    gdp_section tp;          /* the section in the TP shard (global and TP-local placement)  */
    int64_t rows;            /* rows of this CP rank's slice; 0 for z (never exchanged)      */
    int64_t slice_begin;     /* first row of the slice inside the TP-local section           */
    int64_t core_offset;     /* first row of the section in the core's layout V..|K..|Q|b..|a
                                (conv sections: the same offsets, V..|K..|Q come first)      */
} gdp_cp_section;

/* Section `index` in [0, 3M+3) of in_proj / [0, 2M+1) of conv, in semantic order, sliced for
 * the CP rank: V, b, a by its heads, K and Q by its group(s). INVALID_ARGUMENT for an index out
 * of range or a shard not filled by gdp_cp_shard_init. */
GDP_API gdp_status_t gdp_cp_shard_in_proj_section(const gdp_cp_shard *shard, int32_t index, gdp_cp_section *out);
GDP_API gdp_status_t gdp_cp_shard_conv_section(const gdp_cp_shard *shard, int32_t index, gdp_cp_section *out);

/* The rank layout of a tp x cp job: world_rank -> (tp_rank, cp_rank), rank = tp_rank + tp_size *
 * cp_rank. INVALID_ARGUMENT unless tp_size >= 1, world_size is a multiple of tp_size and
 * world_rank is in [0, world_size); *cp_size = world_size / tp_size. */
GDP_API gdp_status_t gdp_parallel_ranks(int32_t world_rank, int32_t world_size, int32_t tp_size, int32_t *tp_rank,
                                        int32_t *cp_rank, int32_t *cp_size);

#ifdef __cplusplus
}
#endif

#endif /* GDP_CONFIG_H */
