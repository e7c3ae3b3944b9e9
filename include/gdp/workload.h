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

/* Limits of what a workload may ask for, checked while reading (before anything is allocated
 * for a request), so a typo or a hostile file fails at once with the value, the limit and the
 * option that raises it instead of allocating gigabytes or sleeping for days (docs/limits.md).
 * gdp-run: --max-requests, --max-prompt-len, --max-new-tokens, --max-arrival. */
typedef struct gdp_workload_limits {
    int32_t max_requests;   /* requests in one workload                                   */
    int32_t max_prompt_len; /* tokens of one prompt                                       */
    int32_t max_new_tokens; /* max_new_tokens of one request                              */
    double  max_arrival_s;  /* latest arrival time, seconds after the start (the horizon) */
} gdp_workload_limits;

/* Defaults: 1,000,000 requests, prompts of 1,048,576 tokens (4 MiB of ids), 1,048,576 new
 * tokens, arrivals within 86,400 s (one day). */
#define GDP_WORKLOAD_DEFAULT_MAX_REQUESTS 1000000
#define GDP_WORKLOAD_DEFAULT_MAX_PROMPT_LEN (1 << 20)
#define GDP_WORKLOAD_DEFAULT_MAX_NEW_TOKENS (1 << 20)
#define GDP_WORKLOAD_DEFAULT_MAX_ARRIVAL_S 86400.0
GDP_API gdp_workload_limits gdp_workload_limits_default(void);
/* INVALID_ARGUMENT naming the field unless every limit is >= 1 (the horizon finite and >= 0). */
GDP_API gdp_status_t gdp_workload_limits_check(const gdp_workload_limits *limits);

/* What a request gets for each field it does not give: its sampling options and stop tokens.
 * A request without its own "seed" gets gdp_request_seed(sampling.seed, id), so its draws
 * depend on its id, never on the order or the other requests of the workload. */
typedef struct gdp_request_defaults {
    gdp_sampling_params sampling;                  /* greedy by default (sampling.h)        */
    int32_t             n_stop;                    /* 0 .. GDP_MAX_STOP_TOKENS              */
    int32_t             stop[GDP_MAX_STOP_TOKENS]; /* token ids in [0, vocab)               */
} gdp_request_defaults;

/* gdp_sampling_params_default() (greedy, seed 0) and no stop tokens. */
GDP_API gdp_request_defaults gdp_request_defaults_default(void);
/* A request's own seed from a base seed and its id: the splitmix64 finalizer of
 * (base_seed + 0x9e3779b97f4a7c15 * (id + 1)), so neighbouring ids get unrelated seeds. */
GDP_API uint64_t gdp_request_seed(uint64_t base_seed, int64_t id);

/* gdp-run's built-in workload: 32 requests all at t = 0 (rate 0), prompts 16..300, 32 new tokens each,
 * repeat 0.3, seed 1. */
GDP_API gdp_status_t gdp_workload_synthetic_default(gdp_synthetic_workload *params);
/* Parses "n=32,rate=16,prompt=16-300,new=32,repeat=0.3,seed=1" (any subset, any order, an
 * optional "synthetic:" prefix; "prompt=100" means 100-100) over the values in *params.
 * INVALID_ARGUMENT naming the key or value that is wrong (params untouched). */
GDP_API gdp_status_t gdp_workload_parse_synthetic(const char *spec, gdp_synthetic_workload *params);
/* Generates the workload (token ids in [0, vocab_size)) with default limits and request
 * defaults: gdp_workload_synthetic_ex(out, params, vocab_size, NULL, NULL). */
GDP_API gdp_status_t gdp_workload_synthetic(gdp_workload *out, const gdp_synthetic_workload *params,
                                            int64_t vocab_size);
/* The same under `limits` (NULL: gdp_workload_limits_default()), every request taking
 * `defaults` (NULL: gdp_request_defaults_default(); the seed mixed with the request id).
 * INVALID_ARGUMENT (*out untouched) for bad params or defaults, or a workload past a limit:
 * n above max_requests, prompt or new-token maxima above theirs, or an arrival past the
 * horizon (a rate so small that the Poisson arrivals of n requests run past max_arrival_s);
 * the message names the value, the limit and the option that raises it. */
GDP_API gdp_status_t gdp_workload_synthetic_ex(gdp_workload *out, const gdp_synthetic_workload *params,
                                               int64_t vocab_size, const gdp_workload_limits *limits,
                                               const gdp_request_defaults *defaults);
/* Reads a JSONL workload (docs/gdp-run.md): per line an object with
 *   "prompt": [token ids]  or  "prompt_len": n   (exactly one),
 *   "max_new_tokens": n    (required),
 *   "id": n                (default: the request's index), "arrival": seconds (default 0),
 *   "temperature": t, "top_k": k, "top_p": p (gdp_sampling_params_check's ranges),
 *   "seed": s (an integer >= 0), "stop": [token ids] (at most GDP_MAX_STOP_TOKENS)
 *                          (each default: the request defaults; no "seed": the mixed seed).
 * Blank lines and lines starting with '#' are skipped. Prompts given as a length get
 * tokens drawn from (seed, id). With default limits and request defaults:
 * gdp_workload_load_jsonl_ex(out, path, vocab_size, seed, NULL, NULL). Errors (*out
 * untouched): SYSTEM_ERROR when the file cannot be read; INVALID_ARGUMENT naming the file,
 * line and field (bad JSON, a NUL byte, a missing or ill-typed field, a token outside
 * [0, vocab_size), a duplicate id (both lines), a value past a limit, no request at all). */
GDP_API gdp_status_t gdp_workload_load_jsonl(gdp_workload *out, const char *path, int64_t vocab_size,
                                             uint64_t seed);
/* The same under `limits` (NULL: defaults) with `defaults` for the fields a line omits (NULL:
 * gdp_request_defaults_default()). */
GDP_API gdp_status_t gdp_workload_load_jsonl_ex(gdp_workload *out, const char *path, int64_t vocab_size,
                                                uint64_t seed, const gdp_workload_limits *limits,
                                                const gdp_request_defaults *defaults);
/* Frees the requests and zeroes *wl. A zeroed workload is a no-op. */
GDP_API gdp_status_t gdp_workload_free(gdp_workload *wl);

#ifdef __cplusplus
}
#endif

#endif /* GDP_WORKLOAD_H */
