/*
 * workload.c: the request workloads of the engine (include/gdp/engine.h): a JSONL reader
 * (one request per line, parsed with jansson) and a seeded synthetic generator (Poisson
 * arrivals, uniform prompt and output lengths, text-like prompts that repeat spans of
 * themselves). docs/gdp-run.md documents the format.
 *
 * Prompts given as a length draw their tokens from (seed, request id) with the same
 * generator as synthetic prompts, so a file names a workload exactly. Both readers apply
 * the workload limits (gdp_workload_limits: requests, prompt length, new tokens, arrival
 * horizon) before allocating anything for a request, and give every request the request
 * defaults (sampling options, stop tokens) for the fields it does not set.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "gdp/engine.h"
#include "internal.h"
#include "rng.h"

/* splitmix64 (rng.h): the request's own stream from (seed, id). */
typedef struct wl_rng {
    uint64_t state;
} wl_rng;

static uint64_t wl_next(wl_rng *r) { return gdp_splitmix64_next(&r->state); }

/* Uniform on (0, 1). */
static double wl_uniform(wl_rng *r) { return gdp_splitmix64_open01(&r->state); }

/* Uniform integer in [lo, hi]. */
static int32_t wl_range(wl_rng *r, int32_t lo, int32_t hi) {
    return lo + (int32_t)(wl_next(r) % (uint64_t)(hi - lo + 1));
}

static void wl_seed(wl_rng *r, uint64_t seed, uint64_t stream) {
    r->state = seed * 0x2545f4914f6cdd1dull ^ (stream + 0x632be59bd9b4e019ull);
    (void)wl_next(r);
}

/* Text-like prompt: random tokens, and with probability `repeat` per token a copy of an
 * earlier span (4..12 tokens) of the prompt so far, so n-gram lookups find matches. */
static void fill_prompt(int32_t *p, int32_t n, int64_t vocab, double repeat, uint64_t seed, int64_t id) {
    wl_rng r;
    wl_seed(&r, seed, (uint64_t)id * 2 + 1);
    int32_t i = 0;
    while (i < n) {
        if (i >= 8 && wl_uniform(&r) < repeat) {
            const int32_t len = wl_range(&r, 4, 12), from = wl_range(&r, 0, i - 4);
            for (int32_t k = 0; k < len && i < n && from + k < i; k++)
                p[i++] = p[from + k];
        } else {
            p[i++] = (int32_t)(wl_next(&r) % (uint64_t)vocab);
        }
    }
}

gdp_status_t gdp_workload_free(gdp_workload *wl) {
    if (wl == NULL)
        return GDP_STATUS_SUCCESS;
    for (int32_t i = 0; wl->requests != NULL && i < wl->n_requests; i++)
        free(wl->requests[i].prompt);
    free(wl->requests);
    memset(wl, 0, sizeof *wl);
    return GDP_STATUS_SUCCESS;
}

/* Stable sort by arrival (ties keep file order): qsort on (arrival, index), since a workload
 * may hold up to max_requests (a million by default) requests. */
typedef struct arrival_key {
    double  arrival;
    int32_t index;
} arrival_key;

static int by_arrival(const void *pa, const void *pb) {
    const arrival_key *a = pa, *b = pb;
    if (a->arrival != b->arrival)
        return a->arrival < b->arrival ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

static gdp_status_t sort_by_arrival(gdp_request_spec *r, int32_t n) {
    arrival_key *keys = gdp_calloc((size_t)n, sizeof *keys, "the arrival order");
    gdp_request_spec *sorted = keys ? gdp_calloc((size_t)n, sizeof *sorted, "the arrival order") : NULL;
    if (sorted == NULL) {
        free(keys);
        return GDP_STATUS_SYSTEM_ERROR;
    }
    for (int32_t i = 0; i < n; i++)
        keys[i] = (arrival_key){r[i].arrival_s, i};
    qsort(keys, (size_t)n, sizeof *keys, by_arrival);
    for (int32_t i = 0; i < n; i++)
        sorted[i] = r[keys[i].index];
    memcpy(r, sorted, sizeof *r * (size_t)n);
    free(sorted);
    free(keys);
    return GDP_STATUS_SUCCESS;
}

/* ---- limits and request defaults ------------------------------------------------------------ */
gdp_workload_limits gdp_workload_limits_default(void) {
    return (gdp_workload_limits){.max_requests = GDP_WORKLOAD_DEFAULT_MAX_REQUESTS,
                                 .max_prompt_len = GDP_WORKLOAD_DEFAULT_MAX_PROMPT_LEN,
                                 .max_new_tokens = GDP_WORKLOAD_DEFAULT_MAX_NEW_TOKENS,
                                 .max_arrival_s = GDP_WORKLOAD_DEFAULT_MAX_ARRIVAL_S};
}

gdp_status_t gdp_workload_limits_check(const gdp_workload_limits *l) {
    static const char *op = "gdp_workload_limits_check";
    if (l == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: limits is NULL", op);
    if (l->max_requests < 1 || l->max_prompt_len < 1 || l->max_new_tokens < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: max_requests = %d, max_prompt_len = %d and max_new_tokens = %d must each be >= 1", op,
                 l->max_requests, l->max_prompt_len, l->max_new_tokens);
    if (!isfinite(l->max_arrival_s) || l->max_arrival_s < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: max_arrival_s = %g must be a finite number of seconds >= 0", op,
                 l->max_arrival_s);
    return GDP_STATUS_SUCCESS;
}

gdp_request_defaults gdp_request_defaults_default(void) {
    gdp_request_defaults d;
    memset(&d, 0, sizeof d);
    d.sampling = gdp_sampling_params_default();
    return d;
}

uint64_t gdp_request_seed(uint64_t base_seed, int64_t id) {
    return gdp_splitmix64_mix(base_seed + GDP_SPLITMIX64_GAMMA * ((uint64_t)id + 1));
}

/* Stop token ids: at most GDP_MAX_STOP_TOKENS, each in the vocabulary. */
static gdp_status_t check_stop(const char *what, int32_t n_stop, const int32_t *stop, int64_t vocab) {
    if (n_stop < 0 || n_stop > GDP_MAX_STOP_TOKENS)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %d stop tokens; give 0 to %d", what, n_stop, GDP_MAX_STOP_TOKENS);
    for (int32_t i = 0; i < n_stop; i++)
        if (stop[i] < 0 || stop[i] >= vocab)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: stop[%d] = %d is outside the model's vocabulary [0, %lld)",
                     what, i, stop[i], (long long)vocab);
    return GDP_STATUS_SUCCESS;
}

/* The limits and defaults a reader runs with (NULL: the defaults), checked. */
static gdp_status_t resolve_options(const gdp_workload_limits *limits, const gdp_request_defaults *defaults,
                                    int64_t vocab, gdp_workload_limits *l, gdp_request_defaults *d) {
    *l = limits ? *limits : gdp_workload_limits_default();
    *d = defaults ? *defaults : gdp_request_defaults_default();
    GDP_CHECK(gdp_workload_limits_check(l));
    GDP_CHECK(gdp_sampling_params_check(&d->sampling, "the request defaults"));
    return check_stop("the request defaults", d->n_stop, d->stop, vocab);
}

/* A request's defaults: the sampling options with the seed mixed with its id, the stop ids. */
static void apply_defaults(gdp_request_spec *q, const gdp_request_defaults *d) {
    q->sampling = d->sampling;
    q->sampling.seed = gdp_request_seed(d->sampling.seed, q->id);
    q->n_stop = d->n_stop;
    memcpy(q->stop, d->stop, sizeof q->stop);
}

/* ---- synthetic ------------------------------------------------------------------------ */
gdp_status_t gdp_workload_synthetic_default(gdp_synthetic_workload *params) {
    if (params == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_workload_synthetic_default: params is NULL");
    *params = (gdp_synthetic_workload){.n_requests = 32, .rate = 0.0, .prompt_min = 16, .prompt_max = 300,
                                       .new_min = 32, .new_max = 32, .repeat = 0.3, .seed = 1};
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t validate_synthetic(const gdp_synthetic_workload *p, const char *op) {
    if (p->n_requests < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: n = %d requests; a workload needs at least one", op, p->n_requests);
    if (!(p->rate >= 0) || isinf(p->rate))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: rate = %g arrivals/s must be finite and >= 0 (0: all at t = 0)", op,
                 p->rate);
    if (p->prompt_min < 1 || p->prompt_max < p->prompt_min)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: prompt lengths %d-%d; need 1 <= min <= max", op, p->prompt_min,
                 p->prompt_max);
    if (p->new_min < 1 || p->new_max < p->new_min)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: new-token counts %d-%d; need 1 <= min <= max", op, p->new_min,
                 p->new_max);
    if (!(p->repeat >= 0 && p->repeat <= 1))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: repeat = %g must be in [0, 1]", op, p->repeat);
    return GDP_STATUS_SUCCESS;
}

/* "a-b" or "a" into [lo, hi]. */
static bool parse_range(const char *v, int32_t *lo, int32_t *hi) {
    char *end = NULL;
    errno = 0;
    long a = strtol(v, &end, 10), b = a;
    if (errno || end == v)
        return false;
    if (*end == '-' || *end == ':') {
        const char *s = end + 1;
        b = strtol(s, &end, 10);
        if (errno || end == s)
            return false;
    }
    if (*end != '\0' || a < INT32_MIN || a > INT32_MAX || b < INT32_MIN || b > INT32_MAX)
        return false;
    *lo = (int32_t)a, *hi = (int32_t)b;
    return true;
}

gdp_status_t gdp_workload_parse_synthetic(const char *spec, gdp_synthetic_workload *params) {
    static const char *op = "gdp_workload_parse_synthetic";
    if (spec == NULL || params == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: spec and params must not be NULL", op);
    if (strncmp(spec, "synthetic:", 10) == 0)
        spec += 10;
    else if (strcmp(spec, "synthetic") == 0)
        spec += 9;
    gdp_synthetic_workload p = *params;
    char buf[512];
    if (strlen(spec) >= sizeof buf)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the spec is longer than %zu characters", op, sizeof buf - 1);
    strcpy(buf, spec);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (eq == NULL)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: '%s' is not key=value (keys: n, rate, prompt, new, repeat, seed; e.g. "
                     "n=32,rate=16,prompt=16-300,new=32)", op, item);
        *eq = '\0';
        const char *key = item, *val = eq + 1;
        char *end = NULL;
        bool ok = true;
        errno = 0;
        if (!strcmp(key, "n")) {
            long n = strtol(val, &end, 10);
            ok = !errno && end != val && *end == '\0' && n >= 1 && n <= INT32_MAX;
            p.n_requests = ok ? (int32_t)n : p.n_requests;
        } else if (!strcmp(key, "rate") || !strcmp(key, "repeat")) {
            double d = strtod(val, &end);
            ok = !errno && end != val && *end == '\0';
            if (ok)
                *(key[1] == 'a' ? &p.rate : &p.repeat) = d;
        } else if (!strcmp(key, "prompt")) {
            ok = parse_range(val, &p.prompt_min, &p.prompt_max);
        } else if (!strcmp(key, "new")) {
            ok = parse_range(val, &p.new_min, &p.new_max);
        } else if (!strcmp(key, "seed")) {
            unsigned long long s = strtoull(val, &end, 10);
            ok = !errno && end != val && *end == '\0';
            p.seed = ok ? (uint64_t)s : p.seed;
        } else {
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: unknown key '%s' (keys: n, rate, prompt, new, repeat, seed)", op, key);
        }
        if (!ok)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s=%s is not a valid %s", op, key, val,
                     !strcmp(key, "prompt") || !strcmp(key, "new") ? "length or range (e.g. 16-300)"
                     : !strcmp(key, "n") ? "request count (>= 1)" : "number");
    }
    GDP_CHECK(validate_synthetic(&p, op));
    *params = p;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_workload_synthetic(gdp_workload *out, const gdp_synthetic_workload *params, int64_t vocab_size) {
    return gdp_workload_synthetic_ex(out, params, vocab_size, NULL, NULL);
}

gdp_status_t gdp_workload_synthetic_ex(gdp_workload *out, const gdp_synthetic_workload *params, int64_t vocab_size,
                                       const gdp_workload_limits *limits, const gdp_request_defaults *defaults) {
    static const char *op = "gdp_workload_synthetic";
    if (out == NULL || params == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and params must not be NULL", op);
    GDP_CHECK(validate_synthetic(params, op));
    if (vocab_size < 1 || vocab_size > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: vocab_size = %lld must be in [1, 2^31)", op,
                 (long long)vocab_size);
    gdp_workload_limits lim;
    gdp_request_defaults dflt;
    GDP_CHECK(resolve_options(limits, defaults, vocab_size, &lim, &dflt));
    if (params->n_requests > lim.max_requests)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: n = %d requests exceeds the limit of %d requests; raise it with gdp-run --max-requests N "
                 "(gdp_workload_limits.max_requests)", op, params->n_requests, lim.max_requests);
    if (params->prompt_max > lim.max_prompt_len)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: prompts of up to %d tokens exceed the limit of %d; raise it with gdp-run --max-prompt-len N "
                 "(gdp_workload_limits.max_prompt_len)", op, params->prompt_max, lim.max_prompt_len);
    if (params->new_max > lim.max_new_tokens)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: up to %d new tokens per request exceed the limit of %d; raise it with gdp-run --max-new-tokens N "
                 "(gdp_workload_limits.max_new_tokens)", op, params->new_max, lim.max_new_tokens);
    /* The arrivals first, before any prompt is allocated: a tiny rate spreads them past any
     * horizon (1 / rate seconds apart on average), and 1e300 s would end in a sleep of forever
     * or an overflowing clock downstream. */
    {
        wl_rng arrivals;
        wl_seed(&arrivals, params->seed, UINT64_MAX);
        double t = 0;
        for (int32_t i = 0; params->rate > 0 && i < params->n_requests; i++) {
            t += -log(wl_uniform(&arrivals)) / params->rate;
            if (!(t <= lim.max_arrival_s))
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: request %d would arrive at %g s, past the arrival horizon of %g s: rate = %g arrivals/s "
                         "spreads %d requests over about %g s; raise the rate, or the horizon with gdp-run "
                         "--max-arrival S (gdp_workload_limits.max_arrival_s)",
                         op, i, t, lim.max_arrival_s, params->rate, params->n_requests,
                         (double)params->n_requests / params->rate);
        }
    }
    gdp_workload wl;
    memset(&wl, 0, sizeof wl);
    wl.requests = gdp_calloc((size_t)params->n_requests, sizeof *wl.requests, "the workload's requests");
    if (wl.requests == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    wl.n_requests = params->n_requests;
    /* Arrivals draw from their own stream, so the rate changes when requests come, not
     * which requests come. */
    wl_rng r, arrivals;
    wl_seed(&r, params->seed, 0);
    wl_seed(&arrivals, params->seed, UINT64_MAX);
    double t = 0;
    for (int32_t i = 0; i < wl.n_requests; i++) {
        gdp_request_spec *q = &wl.requests[i];
        if (params->rate > 0)
            t += -log(wl_uniform(&arrivals)) / params->rate; /* exponential gaps: a Poisson process */
        q->id = i;
        q->arrival_s = t;
        q->prompt_len = wl_range(&r, params->prompt_min, params->prompt_max);
        q->max_new_tokens = wl_range(&r, params->new_min, params->new_max);
        q->prompt = gdp_calloc((size_t)q->prompt_len, sizeof(int32_t), "a synthetic prompt");
        if (q->prompt == NULL) {
            gdp_workload_free(&wl);
            return GDP_STATUS_SYSTEM_ERROR;
        }
        fill_prompt(q->prompt, q->prompt_len, vocab_size, params->repeat, params->seed, q->id);
        apply_defaults(q, &dflt);
    }
    snprintf(wl.source, sizeof wl.source, "synthetic:n=%d,rate=%g,prompt=%d-%d,new=%d-%d,repeat=%g,seed=%llu",
             params->n_requests, params->rate, params->prompt_min, params->prompt_max, params->new_min,
             params->new_max, params->repeat, (unsigned long long)params->seed);
    *out = wl;
    return GDP_STATUS_SUCCESS;
}

/* ---- JSONL ---------------------------------------------------------------------------- */
static const char *const k_fields[] = {"id",     "arrival",     "prompt", "prompt_len", "max_new_tokens",
                                       "temperature", "top_k", "top_p",  "seed",       "stop"};
#define FIELD_LIST "id, arrival, prompt or prompt_len, max_new_tokens, temperature, top_k, top_p, seed, stop"

/* Where a line is, for messages: "gdp_workload_load_jsonl: FILE:LINE". */
typedef struct line_ref {
    const char *path;
    int64_t     line;
} line_ref;
#define AT "gdp_workload_load_jsonl: %s:%lld: "
#define AT_ARGS(r) (r)->path, (long long)(r)->line

/* An integer field of a request object: absent -> *present = false. */
static gdp_status_t json_int_field(const json_t *obj, const char *key, bool *present, int64_t *out,
                                   const line_ref *at) {
    const json_t *v = json_object_get(obj, key);
    *present = v != NULL;
    if (v == NULL)
        return GDP_STATUS_SUCCESS;
    if (!json_is_integer(v))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "\"%s\" must be an integer", AT_ARGS(at), key);
    *out = json_integer_value(v);
    return GDP_STATUS_SUCCESS;
}

/* A number field (integer or real): absent -> *present = false. */
static gdp_status_t json_num_field(const json_t *obj, const char *key, bool *present, double *out,
                                   const line_ref *at) {
    const json_t *v = json_object_get(obj, key);
    *present = v != NULL;
    if (v == NULL)
        return GDP_STATUS_SUCCESS;
    if (!json_is_number(v))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "\"%s\" must be a number", AT_ARGS(at), key);
    *out = json_number_value(v);
    return GDP_STATUS_SUCCESS;
}

/* The sampling fields and "stop" of a request over its defaults (seed: mixed with the id). */
static gdp_status_t parse_sampling(const json_t *obj, gdp_request_spec *q, int64_t vocab,
                                   const gdp_request_defaults *d, const line_ref *at) {
    apply_defaults(q, d);
    bool has = false;
    double num = 0;
    int64_t i64 = 0;
    GDP_CHECK(json_num_field(obj, "temperature", &has, &num, at));
    if (has)
        q->sampling.temperature = (float)num; /* a value beyond float is Inf: refused below */
    GDP_CHECK(json_int_field(obj, "top_k", &has, &i64, at));
    if (has) /* the range is gdp_sampling_params_check's; only keep the int32 narrowing exact */
        q->sampling.top_k = i64 < INT32_MIN ? INT32_MIN : i64 > INT32_MAX ? INT32_MAX : (int32_t)i64;
    GDP_CHECK(json_num_field(obj, "top_p", &has, &num, at));
    if (has)
        q->sampling.top_p = (float)num;
    GDP_CHECK(json_int_field(obj, "seed", &has, &i64, at));
    if (has) {
        if (i64 < 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "\"seed\" is %lld; give an integer >= 0", AT_ARGS(at),
                     (long long)i64);
        q->sampling.seed = (uint64_t)i64;
    }
    char what[600];
    snprintf(what, sizeof what, AT "the request", AT_ARGS(at));
    GDP_CHECK(gdp_sampling_params_check(&q->sampling, what));
    const json_t *stop = json_object_get(obj, "stop");
    if (stop != NULL) {
        if (!json_is_array(stop))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "\"stop\" must be an array of token ids", AT_ARGS(at));
        if (json_array_size(stop) > GDP_MAX_STOP_TOKENS)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "\"stop\" holds %zu token ids; at most %d are allowed",
                     AT_ARGS(at), json_array_size(stop), GDP_MAX_STOP_TOKENS);
        q->n_stop = (int32_t)json_array_size(stop);
        for (int32_t i = 0; i < q->n_stop; i++) {
            const json_t *t = json_array_get(stop, (size_t)i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         AT "stop[%d] is not a token id: give integers in [0, %lld) (the model's vocabulary)",
                         AT_ARGS(at), i, (long long)vocab);
            q->stop[i] = (int32_t)json_integer_value(t);
        }
        for (int32_t i = q->n_stop; i < GDP_MAX_STOP_TOKENS; i++)
            q->stop[i] = 0;
    }
    return GDP_STATUS_SUCCESS;
}

/* Parses one request object into *q (q->prompt allocated on success). Every size is checked
 * against the limits before the prompt is allocated. */
static gdp_status_t parse_request(const json_t *obj, gdp_request_spec *q, int64_t index, int64_t vocab,
                                  uint64_t seed, const gdp_workload_limits *lim, const gdp_request_defaults *d,
                                  const line_ref *at, bool *id_given) {
    if (!json_is_object(obj))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "a request must be a JSON object", AT_ARGS(at));
    const char *k = NULL;
    json_t *v = NULL;
    json_object_foreach((json_t *)obj, k, v) {
        bool known = false;
        for (size_t i = 0; i < sizeof k_fields / sizeof k_fields[0]; i++)
            known |= strcmp(k, k_fields[i]) == 0;
        if (!known)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "unknown field \"%s\" (fields: " FIELD_LIST ")", AT_ARGS(at), k);
    }
    bool has_id, has_len, has_new;
    int64_t id = index, len = 0, max_new = 0;
    GDP_CHECK(json_int_field(obj, "id", &has_id, &id, at));
    GDP_CHECK(json_int_field(obj, "prompt_len", &has_len, &len, at));
    GDP_CHECK(json_int_field(obj, "max_new_tokens", &has_new, &max_new, at));
    if (!has_id)
        id = index;
    *id_given = has_id;
    if (!has_new || max_new < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "\"max_new_tokens\" %s; give an integer >= 1", AT_ARGS(at),
                 has_new ? "is out of range" : "is missing");
    if (max_new > lim->max_new_tokens)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 AT "\"max_new_tokens\" = %lld exceeds the limit of %d; raise it with gdp-run --max-new-tokens N "
                 "(gdp_workload_limits.max_new_tokens)", AT_ARGS(at), (long long)max_new, lim->max_new_tokens);
    double arrival = 0;
    bool has_arrival = false;
    GDP_CHECK(json_num_field(obj, "arrival", &has_arrival, &arrival, at));
    if (has_arrival && !(arrival >= 0))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "\"arrival\" must be a number of seconds >= 0", AT_ARGS(at));
    if (arrival > lim->max_arrival_s)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 AT "\"arrival\" = %g s is past the arrival horizon of %g s; raise it with gdp-run --max-arrival S "
                 "(gdp_workload_limits.max_arrival_s), or run with --no-arrivals", AT_ARGS(at), arrival,
                 lim->max_arrival_s);
    const json_t *prompt = json_object_get(obj, "prompt");
    if ((prompt != NULL) == has_len)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "give exactly one of \"prompt\" (token ids) and \"prompt_len\" (a "
                 "length; tokens drawn from the seed)", AT_ARGS(at));
    if (prompt != NULL) {
        if (!json_is_array(prompt) || json_array_size(prompt) == 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "\"prompt\" must be a non-empty array of token ids", AT_ARGS(at));
        len = (int64_t)json_array_size(prompt);
    }
    if (len < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "the prompt length %lld must be >= 1", AT_ARGS(at), (long long)len);
    if (len > lim->max_prompt_len)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 AT "the prompt length %lld exceeds the limit of %d tokens; raise it with gdp-run --max-prompt-len N "
                 "(gdp_workload_limits.max_prompt_len)", AT_ARGS(at), (long long)len, lim->max_prompt_len);
    gdp_request_spec r;
    memset(&r, 0, sizeof r);
    r.id = id;
    GDP_CHECK(parse_sampling(obj, &r, vocab, d, at));
    int32_t *tokens = gdp_calloc((size_t)len, sizeof(int32_t), "a workload prompt");
    if (tokens == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    if (prompt != NULL) {
        for (int64_t i = 0; i < len; i++) {
            const json_t *t = json_array_get(prompt, (size_t)i);
            const int64_t tok = json_is_integer(t) ? json_integer_value(t) : -1;
            if (!json_is_integer(t)) {
                free(tokens);
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "prompt[%lld] is not an integer; token ids are integers in "
                         "[0, %lld) (the model's vocabulary)", AT_ARGS(at), (long long)i, (long long)vocab);
            }
            if (tok < 0 || tok >= vocab) {
                free(tokens);
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, AT "prompt[%lld] = %lld is outside the model's vocabulary "
                         "[0, %lld)", AT_ARGS(at), (long long)i, (long long)tok, (long long)vocab);
            }
            tokens[i] = (int32_t)tok;
        }
    } else {
        fill_prompt(tokens, (int32_t)len, vocab, 0.3, seed, id);
    }
    r.arrival_s = arrival;
    r.prompt_len = (int32_t)len;
    r.prompt = tokens;
    r.max_new_tokens = (int32_t)max_new;
    *q = r;
    return GDP_STATUS_SUCCESS;
}

/* Where each request came from, for the duplicate-id message. */
typedef struct request_origin {
    int64_t id;
    int64_t line;
    bool    id_given;
} request_origin;

static int by_id_then_line(const void *pa, const void *pb) {
    const request_origin *a = pa, *b = pb;
    if (a->id != b->id)
        return a->id < b->id ? -1 : 1;
    return (a->line > b->line) - (a->line < b->line);
}

/* Ids must be unique. Sorted by (id, line), so it stays O(n log n) for large workloads; of all
 * repeated ids it reports the one whose second use comes first in the file (where reading line
 * by line would have stopped), naming both lines and saying when an id was the default. */
static gdp_status_t check_unique_ids(const char *path, request_origin *o, int32_t n) {
    qsort(o, (size_t)n, sizeof *o, by_id_then_line);
    int32_t worst = -1;
    for (int32_t i = 1; i < n; i++)
        if (o[i].id == o[i - 1].id && (i < 2 || o[i - 2].id != o[i].id) && (worst < 0 || o[i].line < o[worst].line))
            worst = i;
    if (worst < 0)
        return GDP_STATUS_SUCCESS;
    const request_origin *a = &o[worst - 1], *b = &o[worst];
    GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
             "gdp_workload_load_jsonl: %s:%lld: id %lld is used twice: by line %lld%s and by line %lld%s; ids must be "
             "unique (a line without \"id\" takes its request's index, 0 for the first request): give the line an "
             "explicit unique \"id\"",
             path, (long long)b->line, (long long)b->id, (long long)a->line,
             a->id_given ? "" : " (no \"id\": the default, its request index)", (long long)b->line,
             b->id_given ? "" : " (no \"id\": the default, its request index)");
}

gdp_status_t gdp_workload_load_jsonl(gdp_workload *out, const char *path, int64_t vocab_size, uint64_t seed) {
    return gdp_workload_load_jsonl_ex(out, path, vocab_size, seed, NULL, NULL);
}

gdp_status_t gdp_workload_load_jsonl_ex(gdp_workload *out, const char *path, int64_t vocab_size, uint64_t seed,
                                        const gdp_workload_limits *limits, const gdp_request_defaults *defaults) {
    static const char *op = "gdp_workload_load_jsonl";
    if (out == NULL || path == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and path must not be NULL", op);
    if (vocab_size < 1 || vocab_size > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: vocab_size = %lld must be in [1, 2^31)", op,
                 (long long)vocab_size);
    gdp_workload_limits lim;
    gdp_request_defaults dflt;
    GDP_CHECK(resolve_options(limits, defaults, vocab_size, &lim, &dflt));
    FILE *f = fopen(path, "r");
    if (f == NULL)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "%s: cannot open %s: %s", op, path, strerror(errno));
    gdp_workload wl;
    memset(&wl, 0, sizeof wl);
    request_origin *origin = NULL;
    int32_t cap = 0;
    char *text = NULL;
    size_t text_cap = 0;
    line_ref at = {.path = path, .line = 0};
    gdp_status_t st = GDP_STATUS_SUCCESS;
    ssize_t got;
    while (st == GDP_STATUS_SUCCESS && (got = getline(&text, &text_cap, f)) >= 0) {
        at.line++;
        /* A NUL byte would end the line for a C-string parser, silently dropping the rest. */
        const char *nul = memchr(text, '\0', (size_t)got);
        if (nul != NULL) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           AT "the line holds a NUL byte at column %lld; a JSONL workload is text (is the file "
                           "binary or UTF-16?)", AT_ARGS(&at), (long long)(nul - text) + 1);
            break;
        }
        const char *s = text;
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
            s++;
        if (*s == '\0' || *s == '#')
            continue;
        if (wl.n_requests >= lim.max_requests) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT,
                           AT "more than %d requests, the limit; raise it with gdp-run --max-requests N "
                           "(gdp_workload_limits.max_requests)", AT_ARGS(&at), lim.max_requests);
            break;
        }
        json_error_t jerr;
        json_t *obj = json_loadb(s, (size_t)got - (size_t)(s - text), JSON_REJECT_DUPLICATES, &jerr);
        if (obj == NULL) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, AT "not valid JSON (column %d: %s)", AT_ARGS(&at),
                           jerr.column + (int)(s - text), jerr.text);
            break;
        }
        if (wl.n_requests == cap) {
            const int32_t ncap = cap ? (cap > INT32_MAX / 2 ? INT32_MAX : 2 * cap) : 64;
            gdp_request_spec *r = realloc(wl.requests, sizeof *r * (size_t)ncap);
            if (r != NULL)
                wl.requests = r;
            request_origin *o = r ? realloc(origin, sizeof *o * (size_t)ncap) : NULL;
            if (o != NULL)
                origin = o;
            if (r == NULL || o == NULL) {
                json_decref(obj);
                st = GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "%s: out of memory reading %s", op, path);
                break;
            }
            cap = ncap;
        }
        bool id_given = false;
        st = parse_request(obj, &wl.requests[wl.n_requests], wl.n_requests, vocab_size, seed, &lim, &dflt, &at,
                           &id_given);
        json_decref(obj);
        if (st == GDP_STATUS_SUCCESS) {
            origin[wl.n_requests] = (request_origin){wl.requests[wl.n_requests].id, at.line, id_given};
            wl.n_requests++;
        }
    }
    const bool read_error = ferror(f) != 0;
    free(text);
    fclose(f);
    if (st == GDP_STATUS_SUCCESS && read_error)
        st = GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "%s: reading %s failed", op, path);
    if (st == GDP_STATUS_SUCCESS && wl.n_requests == 0)
        st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "%s: %s holds no request (one JSON object per line)", op, path);
    if (st == GDP_STATUS_SUCCESS)
        st = check_unique_ids(path, origin, wl.n_requests);
    if (st == GDP_STATUS_SUCCESS)
        st = sort_by_arrival(wl.requests, wl.n_requests);
    free(origin);
    if (st != GDP_STATUS_SUCCESS) {
        gdp_workload_free(&wl);
        return st;
    }
    snprintf(wl.source, sizeof wl.source, "%s", path);
    *out = wl;
    return GDP_STATUS_SUCCESS;
}
