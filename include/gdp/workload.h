/*
 * workload.h: what gdp-run serves: a list of requests (prompt tokens, how many to generate,
 * when each arrives), read from a JSONL file or drawn by a seeded synthetic generator
 * (src/workload.c). Token ids of a prompt given as a length are drawn from (seed, request
 * id), so every run of the same file feeds the same tokens. The engine (engine.h) serves
 * a workload; docs/gdp-run.md describes the file format.
 */
#ifndef GDP_WORKLOAD_H
#define GDP_WORKLOAD_H

#include <stdint.h>

#include "gdp/gdp.h"
#include "gdp/sampling.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GDP_MAX_STOP_TOKENS 16

/* One request. */
typedef struct gdp_request_spec {
    int64_t  id;             /* the user's id (unique within the workload)              */
    double   arrival_s;      /* seconds after the run starts (>= 0)                     */
    int32_t  prompt_len;     /* >= 1                                                    */
    int32_t *prompt;         /* [prompt_len] token ids in [0, vocab), owned by the workload */
    int32_t  max_new_tokens; /* at most this many tokens are generated (>= 1)              */
    gdp_sampling_params sampling; /* greedy by default (sampling.h)                        */
    int32_t  n_stop;         /* stop token ids: generation ends after emitting one of them */
    int32_t  stop[GDP_MAX_STOP_TOKENS];
} gdp_request_spec;

/* A list of requests sorted by arrival (ties keep file order). Free with gdp_workload_free. */
typedef struct gdp_workload {
    int32_t           n_requests;
    gdp_request_spec *requests;   /* [n_requests] */
    char              source[256]; /* the file, or the synthetic spec, for the report */
} gdp_workload;

/* Parameters of the synthetic generator. */
typedef struct gdp_synthetic_workload {
    int32_t  n_requests;   /* >= 1                                                               */
    double   rate;         /* mean arrivals per second (Poisson process); 0: all arrive at t = 0 */
    int32_t  prompt_min;   /* prompt lengths uniform in [prompt_min, prompt_max]                 */
    int32_t  prompt_max;
    int32_t  new_min;      /* max_new_tokens uniform in [new_min, new_max]                       */
    int32_t  new_max;
    double   repeat;       /* probability that a prompt continues with a copy of an earlier span
                              of itself (text-like repetition the n-gram drafter can find)       */
    uint64_t seed;
} gdp_synthetic_workload;

/* gdp-run's built-in workload: 32 requests all at t = 0 (rate 0), prompts 16..300, 32 new tokens each,
 * repeat 0.3, seed 1. */
GDP_API gdp_status_t gdp_workload_synthetic_default(gdp_synthetic_workload *params);
/* Parses "n=32,rate=16,prompt=16-300,new=32,repeat=0.3,seed=1" (any subset, any order, an
 * optional "synthetic:" prefix; "prompt=100" means 100-100) over the values in *params.
 * INVALID_ARGUMENT naming the key or value that is wrong (params untouched). */
GDP_API gdp_status_t gdp_workload_parse_synthetic(const char *spec, gdp_synthetic_workload *params);
/* Generates the workload (token ids in [0, vocab_size)). INVALID_ARGUMENT for bad params. */
GDP_API gdp_status_t gdp_workload_synthetic(gdp_workload *out, const gdp_synthetic_workload *params,
                                            int64_t vocab_size);
/* Reads a JSONL workload (docs/gdp-run.md): per line an object with
 *   "prompt": [token ids]  or  "prompt_len": n   (exactly one),
 *   "max_new_tokens": n    (required),
 *   "id": n                (default: the request's index), "arrival": seconds (default 0).
 * Blank lines and lines starting with '#' are skipped. Prompts given as a length get
 * tokens drawn from (seed, id). Errors (*out untouched): SYSTEM_ERROR when the file cannot
 * be read; INVALID_ARGUMENT naming the file, line and field (bad JSON, a missing or
 * ill-typed field, a token outside [0, vocab_size), a duplicate id, no request at all). */
GDP_API gdp_status_t gdp_workload_load_jsonl(gdp_workload *out, const char *path, int64_t vocab_size,
                                             uint64_t seed);
/* Frees the requests and zeroes *wl. A zeroed workload is a no-op. */
GDP_API gdp_status_t gdp_workload_free(gdp_workload *wl);

#ifdef __cplusplus
}
#endif

#endif /* GDP_WORKLOAD_H */
