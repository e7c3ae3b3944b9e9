/*
 * sampling_internal.h: what the CPU reference (src/sampling.c) and the CUDA kernels
 * (kernels/sampling.cu) of include/gdp/sampling.h must compute identically: the candidate
 * record layout, how a row's options pick its mode and candidate count, the ordering key of
 * (logit, token id), and the counter-based hash that turns (seed, position, token) into the
 * uniform u of the Gumbel draw. Plain C11 static inline functions, compiled for host and
 * device under nvcc. docs/sampling.md gives the algorithm around them.
 */
#ifndef GDP_SAMPLING_INTERNAL_H
#define GDP_SAMPLING_INTERNAL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gdp/sampling.h"
#include "rng.h"

#ifdef __CUDACC__
#define GDP_SAMPLE_FN static inline __host__ __device__
#else
#define GDP_SAMPLE_FN static inline
#endif

/* ---- the candidate record of one row: int32 words, floats and doubles as their bits ----
 * A fixed size per row (GDP_SREC_HEADER + 2 * max_candidates words), so the records of all
 * rows and all ranks can be all-gathered as raw bytes. Stage 1 writes the header and the first
 * n_cand candidate pairs; the words after them are not written. Ids are global token ids. */
enum {
    GDP_SREC_FLAGS = 0,      /* GDP_SAMPLE_NONFINITE | GDP_SAMPLE_INVALID_ROW                    */
    GDP_SREC_ARGMAX = 1,     /* id of the local max (the smaller id among equal logits)          */
    GDP_SREC_MAX = 2,        /* float: the local max logit                                       */
    GDP_SREC_SECOND = 3,     /* float: the local second logit (= max when it repeats; -inf for a
                                slice of one token)                                              */
    GDP_SREC_ABSMAX = 4,     /* float: the local max |logit|                                     */
    GDP_SREC_N_CAND = 5,     /* candidate pairs that follow (0 unless top-k or top-p)            */
    GDP_SREC_Z = 6,          /* double, 2 words: sum exp((l - max) / T) over the slice; written
                                only for top-p without top-k (else 0)                            */
    GDP_SREC_GUMBEL_KEY = 8, /* double, 2 words: the best l / T + G over the slice (temperature
                                sampling without top-k / top-p; else 0)                          */
    GDP_SREC_GUMBEL_ID = 10, /* its id                                                           */
    GDP_SREC_RESERVED = 11,  /* 0                                                                */
    GDP_SREC_HEADER = 12     /* then n_cand pairs (float logit, id), by (logit desc, id asc)     */
};

/* How a row is sampled. */
enum {
    GDP_SMODE_GREEDY = 0,      /* temperature 0: the argmax; top-k and top-p do not matter      */
    GDP_SMODE_TEMPERATURE = 1, /* Gumbel-max over the whole vocabulary, no candidates           */
    GDP_SMODE_CANDIDATES = 2,  /* top-k and / or top-p over the candidates                      */
    GDP_SMODE_INVALID = 3      /* options outside their ranges (gdp_sampling_params_check), or
                                  top_k above the record's max_candidates                      */
};

/* The row's top_p, 1 when off: 1 or 0 (a zeroed row, as gdp_sampling_params_check allows). */
GDP_SAMPLE_FN float gdp_sample_row_top_p(const gdp_sample_row *r) { return r->top_p == 0.0f ? 1.0f : r->top_p; }

GDP_SAMPLE_FN int gdp_sample_row_mode(const gdp_sample_row *r, int32_t max_candidates) {
    const float t = r->temperature;
    if (!(t >= 0.0f && t <= FLT_MAX) || r->top_k < 0 || r->top_k > max_candidates ||
        !(r->top_p >= 0.0f && r->top_p <= 1.0f))
        return GDP_SMODE_INVALID;
    if (t == 0.0f)
        return GDP_SMODE_GREEDY;
    if (r->top_k == 0 && gdp_sample_row_top_p(r) >= 1.0f)
        return GDP_SMODE_TEMPERATURE;
    return GDP_SMODE_CANDIDATES;
}

/* Candidates a slice of vocab_local tokens keeps for a row in GDP_SMODE_CANDIDATES: top_k when
 * set (the global top-k lies in the union of the slices' top-k), else max_candidates. */
GDP_SAMPLE_FN int32_t gdp_sample_row_candidates(const gdp_sample_row *r, int32_t max_candidates,
                                                int64_t vocab_local) {
    const int64_t c = r->top_k > 0 ? r->top_k : max_candidates;
    return (int32_t)(c < vocab_local ? c : vocab_local);
}

/* ---- bits of floats and doubles ---- */
GDP_SAMPLE_FN uint32_t gdp_sample_f32_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}
GDP_SAMPLE_FN float gdp_sample_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}
GDP_SAMPLE_FN void gdp_sample_put_f64(int32_t *words, double x) {
#ifdef __CUDA_ARCH__
    const uint64_t u = (uint64_t)__double_as_longlong(x);
#else
    uint64_t u;
    memcpy(&u, &x, sizeof u);
#endif
    words[0] = (int32_t)(uint32_t)u;
    words[1] = (int32_t)(uint32_t)(u >> 32);
}
GDP_SAMPLE_FN double gdp_sample_get_f64(const int32_t *words) {
    const uint64_t u = (uint64_t)(uint32_t)words[0] | ((uint64_t)(uint32_t)words[1] << 32);
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* ---- the order of (logit, id): larger logit first, then the smaller id ----
 * ord maps a float to a uint32 that sorts like its value (-0 is taken as +0, so equal logits
 * compare equal); the 64-bit key puts ord above the complemented id, so keys are unique and a
 * larger key means "before" in (logit desc, id asc). */
GDP_SAMPLE_FN uint32_t gdp_sample_ord(float x) {
    const uint32_t b = gdp_sample_f32_bits(x == 0.0f ? 0.0f : x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
GDP_SAMPLE_FN float gdp_sample_ord_value(uint32_t o) {
    return gdp_sample_f32_from_bits((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
GDP_SAMPLE_FN uint64_t gdp_sample_key(float x, uint32_t id) {
    return ((uint64_t)gdp_sample_ord(x) << 32) | (uint64_t)(0xffffffffu - id);
}
GDP_SAMPLE_FN uint32_t gdp_sample_key_id(uint64_t key) { return 0xffffffffu - (uint32_t)key; }
GDP_SAMPLE_FN float gdp_sample_key_value(uint64_t key) { return gdp_sample_ord_value((uint32_t)(key >> 32)); }

/* ---- the counter-based hash ----
 * SplitMix64's finalizer (rng.h). A row's stream is the SplitMix64 output
 * of its seed's state at step `position`; a token's 64 bits are the SplitMix64 output of that
 * stream at step token + 1 (another odd increment, so position and token steps never alias).
 * Nothing else enters: the draw of (seed, position, token) is the same on every rank, in
 * every batch, on both backends. */
GDP_SAMPLE_FN uint64_t gdp_sample_mix64(uint64_t x) { return gdp_splitmix64_mix(x); }
GDP_SAMPLE_FN uint64_t gdp_sample_stream(uint64_t seed, int32_t position) {
    return gdp_sample_mix64(gdp_sample_mix64(seed ^ 0x6a09e667f3bcc909ull) +
                            (uint64_t)(uint32_t)position * GDP_SPLITMIX64_GAMMA);
}
GDP_SAMPLE_FN uint64_t gdp_sample_bits(uint64_t stream, uint32_t token) {
    return gdp_sample_mix64(stream + ((uint64_t)token + 1) * 0xd1b54a32d192ed03ull);
}

/* The Gumbel noise G = -log(-log(u)), u = (k + 1/2) 2^-53 with k = bits >> 11, so u is never
 * 0 or 1. -log(u) is taken as -log(u) when u < 1/2 and as -log1p(-(1 - u)) otherwise, with u
 * and 1 - u each exact: the large G (u near 1, the tokens that win) keep their precision. */
GDP_SAMPLE_FN double gdp_sample_gumbel(uint64_t bits) {
    const uint64_t k = bits >> 11;
    double e; /* -log(u): a standard exponential */
    if (k < (1ull << 52))
        e = -log(((double)k + 0.5) * 0x1p-53);
    else
        e = -log1p(-(((double)((1ull << 53) - 1 - k) + 0.5) * 0x1p-53));
    return -log(e);
}
/* The same in float, for the CUDA pass over whole rows: u (or 1 - u) = (2k + 1) 2^-54
 * rounded to float, which is never 0, and never 1 since it is at most 1/2. */
GDP_SAMPLE_FN float gdp_sample_gumbel_f32(uint64_t bits) {
    const uint64_t k = bits >> 11;
    float e;
    if (k < (1ull << 52))
        e = -logf((float)(2 * k + 1) * 0x1p-54f);
    else
        e = -log1pf(-(float)(2 * ((1ull << 53) - 1 - k) + 1) * 0x1p-54f);
    return -logf(e);
}

/* The merge's fold of one part's record header into the row's running totals: the global
 * greedy token (ties: the smaller id) and its top-2 margin, max |logit|, the best Gumbel
 * key, the flags. The same code on both backends, so they agree bit for bit. */
typedef struct gdp_sample_fold {
    float    max, second, absmax;
    uint32_t argmax, best_id;
    double   best_key;
    int32_t  flags;
} gdp_sample_fold;

GDP_SAMPLE_FN gdp_sample_fold gdp_sample_fold_init(int32_t flags) {
    gdp_sample_fold f;
    f.max = -INFINITY, f.second = -INFINITY, f.absmax = 0.0f;
    f.argmax = UINT32_MAX, f.best_id = UINT32_MAX;
    f.best_key = -INFINITY;
    f.flags = flags;
    return f;
}

GDP_SAMPLE_FN void gdp_sample_fold_part(gdp_sample_fold *f, const int32_t *rec) {
    f->flags |= rec[GDP_SREC_FLAGS];
    const float m = gdp_sample_f32_from_bits((uint32_t)rec[GDP_SREC_MAX]);
    const float s = gdp_sample_f32_from_bits((uint32_t)rec[GDP_SREC_SECOND]);
    const uint32_t id = (uint32_t)rec[GDP_SREC_ARGMAX];
    if (m > f->max || (m == f->max && id < f->argmax)) {
        f->second = fmaxf(s, f->max);
        f->max = m;
        f->argmax = id;
    } else {
        f->second = fmaxf(f->second, m);
    }
    f->absmax = fmaxf(f->absmax, gdp_sample_f32_from_bits((uint32_t)rec[GDP_SREC_ABSMAX]));
    const double key = gdp_sample_get_f64(rec + GDP_SREC_GUMBEL_KEY);
    const uint32_t kid = (uint32_t)rec[GDP_SREC_GUMBEL_ID];
    if (key > f->best_key || (key == f->best_key && kid < f->best_id)) {
        f->best_key = key;
        f->best_id = kid;
    }
}

#endif /* GDP_SAMPLING_INTERNAL_H */
