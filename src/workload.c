/*
 * workload.c: the request workloads of the engine (include/gdp/engine.h): a JSONL reader
 * (one request per line, parsed with jansson) and a seeded synthetic generator (Poisson
 * arrivals, uniform prompt and output lengths, text-like prompts that repeat spans of
 * themselves). docs/gdp-run.md documents the format.
 *
 * Prompts given as a length draw their tokens from (seed, request id) with the same
 * generator as synthetic prompts, so a file names a workload exactly.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "gdp/engine.h"
#include "internal.h"

/* splitmix64: the request's own stream from (seed, id). */
typedef struct wl_rng {
    uint64_t state;
} wl_rng;

static uint64_t wl_next(wl_rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform on (0, 1). */
static double wl_uniform(wl_rng *r) { return ((double)(wl_next(r) >> 11) + 0.5) * 0x1.0p-53; }

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

/* Stable sort by arrival (insertion sort keeps file order among ties; workloads are small). */
static void sort_by_arrival(gdp_request_spec *r, int32_t n) {
    for (int32_t i = 1; i < n; i++) {
        gdp_request_spec x = r[i];
        int32_t j = i;
        while (j > 0 && r[j - 1].arrival_s > x.arrival_s) {
            r[j] = r[j - 1];
            j--;
        }
        r[j] = x;
    }
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
    static const char *op = "gdp_workload_synthetic";
    if (out == NULL || params == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and params must not be NULL", op);
    GDP_CHECK(validate_synthetic(params, op));
    if (vocab_size < 1 || vocab_size > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: vocab_size = %lld must be in [1, 2^31)", op,
                 (long long)vocab_size);
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
    }
    snprintf(wl.source, sizeof wl.source, "synthetic:n=%d,rate=%g,prompt=%d-%d,new=%d-%d,repeat=%g,seed=%llu",
             params->n_requests, params->rate, params->prompt_min, params->prompt_max, params->new_min,
             params->new_max, params->repeat, (unsigned long long)params->seed);
    *out = wl;
    return GDP_STATUS_SUCCESS;
}

/* ---- JSONL ---------------------------------------------------------------------------- */

/* An integer field of a request object: absent -> *present = false. */
static gdp_status_t json_int_field(const json_t *obj, const char *key, bool *present, int64_t *out,
                                   const char *path, int64_t line) {
    const json_t *v = json_object_get(obj, key);
    *present = v != NULL;
    if (v == NULL)
        return GDP_STATUS_SUCCESS;
    if (!json_is_integer(v))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_workload_load_jsonl: %s:%lld: \"%s\" must be an integer", path,
                 (long long)line, key);
    *out = json_integer_value(v);
    return GDP_STATUS_SUCCESS;
}

/* Parses one request object into *q (q->prompt allocated on success). */
static gdp_status_t parse_request(const json_t *obj, gdp_request_spec *q, int64_t index, int64_t vocab,
                                  uint64_t seed, const char *path, int64_t line) {
    static const char *op = "gdp_workload_load_jsonl";
    if (!json_is_object(obj))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: a request must be a JSON object", op, path,
                 (long long)line);
    const char *k = NULL;
    json_t *v = NULL;
    json_object_foreach((json_t *)obj, k, v) {
        if (strcmp(k, "id") && strcmp(k, "arrival") && strcmp(k, "prompt") && strcmp(k, "prompt_len") &&
            strcmp(k, "max_new_tokens"))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: %s:%lld: unknown field \"%s\" (fields: id, arrival, prompt or prompt_len, max_new_tokens)",
                     op, path, (long long)line, k);
    }
    bool has_id, has_len, has_new;
    int64_t id = index, len = 0, max_new = 0;
    GDP_CHECK(json_int_field(obj, "id", &has_id, &id, path, line));
    GDP_CHECK(json_int_field(obj, "prompt_len", &has_len, &len, path, line));
    GDP_CHECK(json_int_field(obj, "max_new_tokens", &has_new, &max_new, path, line));
    if (!has_id)
        id = index;
    if (!has_new || max_new < 1 || max_new > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: \"max_new_tokens\" %s; give an integer >= 1", op, path,
                 (long long)line, has_new ? "is out of range" : "is missing");
    double arrival = 0;
    const json_t *a = json_object_get(obj, "arrival");
    if (a != NULL) {
        if (!json_is_number(a) || !(json_number_value(a) >= 0) || isinf(json_number_value(a)))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: \"arrival\" must be a number of seconds >= 0", op,
                     path, (long long)line);
        arrival = json_number_value(a);
    }
    const json_t *prompt = json_object_get(obj, "prompt");
    if ((prompt != NULL) == has_len)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: give exactly one of \"prompt\" (token ids) and "
                 "\"prompt_len\" (a length; tokens drawn from the seed)", op, path, (long long)line);
    if (prompt != NULL) {
        if (!json_is_array(prompt) || json_array_size(prompt) == 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: \"prompt\" must be a non-empty array of token ids",
                     op, path, (long long)line);
        len = (int64_t)json_array_size(prompt);
    }
    /* checked before the prompt is allocated (2^31 tokens would be 8 GB; found by fuzz_workload) */
    if (len < 1 || len > (1 << 20))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: the prompt length %lld must be in [1, 2^20]", op, path,
                 (long long)line, (long long)len);
    int32_t *tokens = gdp_calloc((size_t)len, sizeof(int32_t), "a workload prompt");
    if (tokens == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    if (prompt != NULL) {
        for (int64_t i = 0; i < len; i++) {
            const json_t *t = json_array_get(prompt, (size_t)i);
            const int64_t tok = json_is_integer(t) ? json_integer_value(t) : -1;
            if (!json_is_integer(t)) {
                free(tokens);
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: prompt[%lld] is not an integer; token ids are "
                         "integers in [0, %lld) (the model's vocabulary)", op, path, (long long)line, (long long)i,
                         (long long)vocab);
            }
            if (tok < 0 || tok >= vocab) {
                free(tokens);
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: prompt[%lld] = %lld is outside the model's "
                         "vocabulary [0, %lld)", op, path, (long long)line, (long long)i, (long long)tok,
                         (long long)vocab);
            }
            tokens[i] = (int32_t)tok;
        }
    } else {
        fill_prompt(tokens, (int32_t)len, vocab, 0.3, seed, id);
    }
    *q = (gdp_request_spec){.id = id, .arrival_s = arrival, .prompt_len = (int32_t)len, .prompt = tokens,
                            .max_new_tokens = (int32_t)max_new};
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_workload_load_jsonl(gdp_workload *out, const char *path, int64_t vocab_size, uint64_t seed) {
    static const char *op = "gdp_workload_load_jsonl";
    if (out == NULL || path == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and path must not be NULL", op);
    if (vocab_size < 1 || vocab_size > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: vocab_size = %lld must be in [1, 2^31)", op,
                 (long long)vocab_size);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "%s: cannot open %s: %s", op, path, strerror(errno));
    gdp_workload wl;
    memset(&wl, 0, sizeof wl);
    int32_t cap = 0;
    char *text = NULL;
    size_t text_cap = 0;
    int64_t line = 0;
    gdp_status_t st = GDP_STATUS_SUCCESS;
    ssize_t got;
    while (st == GDP_STATUS_SUCCESS && (got = getline(&text, &text_cap, f)) >= 0) {
        line++;
        const char *s = text;
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
            s++;
        if (*s == '\0' || *s == '#')
            continue;
        json_error_t jerr;
        json_t *obj = json_loads(s, JSON_REJECT_DUPLICATES, &jerr);
        if (obj == NULL) {
            st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: not valid JSON (column %d: %s)", op, path,
                           (long long)line, jerr.column, jerr.text);
            break;
        }
        if (wl.n_requests == cap) {
            const int32_t ncap = cap ? 2 * cap : 64;
            gdp_request_spec *r = realloc(wl.requests, sizeof *r * (size_t)ncap);
            if (r == NULL) {
                json_decref(obj);
                st = GDP_ERROR(GDP_STATUS_SYSTEM_ERROR, "%s: out of memory reading %s", op, path);
                break;
            }
            wl.requests = r;
            cap = ncap;
        }
        st = parse_request(obj, &wl.requests[wl.n_requests], wl.n_requests, vocab_size, seed, path, line);
        json_decref(obj);
        if (st == GDP_STATUS_SUCCESS) {
            for (int32_t i = 0; i < wl.n_requests; i++)
                if (wl.requests[i].id == wl.requests[wl.n_requests].id) {
                    st = GDP_ERROR(GDP_STATUS_INVALID_ARGUMENT, "%s: %s:%lld: id %lld is used twice (ids must be unique)",
                                   op, path, (long long)line, (long long)wl.requests[i].id);
                    free(wl.requests[wl.n_requests].prompt);
                    break;
                }
            if (st == GDP_STATUS_SUCCESS)
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
    if (st != GDP_STATUS_SUCCESS) {
        gdp_workload_free(&wl);
        return st;
    }
    sort_by_arrival(wl.requests, wl.n_requests);
    snprintf(wl.source, sizeof wl.source, "%s", path);
    *out = wl;
    return GDP_STATUS_SUCCESS;
}
