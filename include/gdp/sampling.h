/*
 * sampling.h: token sampling from logits on the backend (CPU reference or CUDA), built for a
 * vocab-parallel LM head: each TP rank holds logits for its slice of the vocabulary, reduces
 * each row to a small candidate record, the records cross ranks (an all-gather of a few KB),
 * and a merge picks the token. Only token ids, margins and flags reach the host.
 *
 *   greedy      temperature == 0: the argmax (ties: the smaller token id)
 *   temperature softmax(logits / temperature)
 *   top-k       keep the top_k most likely tokens (ties: smaller ids first), renormalize
 *   top-p       then keep the smallest prefix (by probability, descending) whose mass
 *               reaches top_p (at least one token), renormalize
 *
 * A draw is the Gumbel-max trick over the kept tokens: token = argmax_v (l_v / T + G_v),
 * where G_v = -log(-log(u)) and u in (0, 1) is a counter-based hash of (seed, position, v).
 * So a request's draws depend only on its seed, the position of the token and its logits:
 * never on the batch it shares, the row it sits in, or how the vocabulary is split.
 *
 * Candidates: a rank keeps for each row its local top min(max_candidates, vocab_local)
 * (top_k when set) logits, and the merge keeps the global top max_candidates (top_k) of their
 * union. top-p without top-k therefore considers the max_candidates (<= GDP_SAMPLING_MAX_CANDIDATES)
 * most likely tokens of the whole vocabulary, however it is split: when the nucleus is larger,
 * it is cut to those candidates (docs/gdp-run.md and docs/sampling.md state this limit). Greedy
 * and pure temperature sampling (no top-k, no top-p) need no candidates and are exact for any
 * vocab.
 *
 * Everything here is graph-capturable on CUDA (no host synchronization, no allocation) and
 * deterministic: the same inputs give the same bits.
 */
#ifndef GDP_SAMPLING_H
#define GDP_SAMPLING_H

#include <stdint.h>

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GDP_SAMPLING_MAX_CANDIDATES 1024

/* A request's sampling options (gdp-run's workload fields). */
typedef struct gdp_sampling_params {
    float    temperature; /* 0: greedy (default); > 0: sample from softmax(logits / temperature) */
    int32_t  top_k;       /* 0: off; else 1 .. GDP_SAMPLING_MAX_CANDIDATES                        */
    float    top_p;       /* 1: off (default); else in (0, 1). In request specs 0 also means off, so
                             a zeroed struct is the default (the engine passes 1 to the kernels)  */
    uint64_t seed;        /* the request's seed                                                   */
} gdp_sampling_params;

/* Greedy, no top-k, no top-p, seed 0. */
GDP_API gdp_sampling_params gdp_sampling_params_default(void);
/* INVALID_ARGUMENT naming the field and value when p is not a valid option set (temperature
 * < 0 or not finite, top_k outside [0, GDP_SAMPLING_MAX_CANDIDATES], top_p outside [0, 1]). */
GDP_API gdp_status_t gdp_sampling_params_check(const gdp_sampling_params *p, const char *what);

/* One row to sample, as the kernels read it (backend memory, 24 bytes). */
typedef struct gdp_sample_row {
    float    temperature;
    int32_t  top_k;
    float    top_p;
    int32_t  position; /* which token of the request this draw is (e.g. its generated count) */
    uint64_t seed;
} gdp_sample_row;

/* The outcome of one row (backend memory, 16 bytes). */
typedef struct gdp_sample_out {
    int32_t token;  /* global token id                                                     */
    float   margin; /* top-1 minus top-2 logit over the whole vocabulary (+inf: vocab of 1) */
    float   scale;  /* max |logit| over the whole vocabulary                                */
    int32_t flags;  /* GDP_SAMPLE_NONFINITE: the row's logits hold NaN or Inf (token 0,
                       margin 0, scale +inf); GDP_SAMPLE_INVALID_ROW: see below           */
} gdp_sample_out;
#define GDP_SAMPLE_NONFINITE 1
/* The row's options are outside the ranges of gdp_sampling_params_check (or top_k >
 * max_candidates): token 0, margin 0, scale 0. Only the CUDA backend returns it, since it
 * cannot read device rows without a sync; the CPU backend refuses such a call instead. */
#define GDP_SAMPLE_INVALID_ROW 2

/* int32 words of one row's candidate record for a capacity of max_candidates (-1 when
 * max_candidates is outside 1 .. GDP_SAMPLING_MAX_CANDIDATES). */
GDP_API int64_t gdp_sample_record_words(int32_t max_candidates);

/* Stage 1, on every rank: records[r] <- the candidate record of logits row r of this rank's
 * vocabulary slice (global ids vocab_offset .. vocab_offset + vocab_local). */
typedef struct gdp_sample_candidates_args {
    const float          *logits;         /* [n_rows, ld] fp32, backend memory           */
    int64_t               n_rows;         /* >= 1                                        */
    int64_t               vocab_local;    /* >= 1                                        */
    int64_t               ld;             /* >= vocab_local                              */
    int64_t               vocab_offset;   /* >= 0                                        */
    const gdp_sample_row *rows;           /* [n_rows] backend memory                     */
    int32_t               max_candidates; /* record capacity, 1 .. GDP_SAMPLING_MAX_CANDIDATES */
    int32_t              *records;        /* [n_rows, gdp_sample_record_words] backend memory */
} gdp_sample_candidates_args;
GDP_API gdp_status_t gdp_sample_candidates(gdp_ctx_t ctx, const gdp_sample_candidates_args *args);

/* Stage 2, on any rank that holds every part's records: out[r] <- the token of row r. */
typedef struct gdp_sample_merge_args {
    const int32_t        *records;        /* [n_parts, n_rows, words] backend memory (part-major,
                                             as an all-gather of the parts' records lays them) */
    int32_t               n_parts;        /* >= 1 (the TP size)                          */
    int64_t               n_rows;
    int32_t               max_candidates; /* as in stage 1                               */
    const gdp_sample_row *rows;           /* [n_rows] backend memory                     */
    gdp_sample_out       *out;            /* [n_rows] backend memory                     */
} gdp_sample_merge_args;
GDP_API gdp_status_t gdp_sample_merge(gdp_ctx_t ctx, const gdp_sample_merge_args *args);

#ifdef __cplusplus
}
#endif

#endif /* GDP_SAMPLING_H */
