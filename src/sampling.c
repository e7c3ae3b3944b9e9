/*
 * sampling.c: the front-ends of gdp_sample_candidates and gdp_sample_merge
 * (include/gdp/sampling.h): argument checks that hold on every backend, dispatch to the CUDA
 * launchers (kernels/sampling.cu), and the CPU reference on host memory, in double.
 *
 * The candidate record of a row (layout in src/sampling_internal.h, GDP_SREC_*):
 *   words  0..11  header: flags, argmax id, max, second, max|l|, n_cand, Z (double),
 *                 the best Gumbel key (double) and its id, a reserved 0
 *   words 12..    n_cand pairs (logit bits, global id), by (logit desc, id asc)
 * gdp_sample_record_words(C) = 12 + 2 C. All ids are global, so the merge needs no offsets.
 *
 * The algorithm (docs/sampling.md):
 *   stage 1, per slice: max, second, argmax, max |l|, non-finite flag; then by mode
 *     greedy       nothing more
 *     temperature  the best Gumbel key l / T + G(seed, position, id) over the slice
 *     candidates   the slice's top C = top_k (else max_candidates) by (logit desc, id asc),
 *                  and Z = sum exp((l - max) / T) when top-p runs without top-k
 *   stage 2, per row: global max / second / argmax / max |l| from the headers, then
 *     greedy       the argmax (ties: the smaller id)
 *     temperature  the best key over the slices (ties: the smaller id)
 *     candidates   the global top K = top_k (else max_candidates) of the union of candidates,
 *                  w_i = exp((l_i - max) / T), Z = sum of w over the K (top-k) or the exact
 *                  Z of the whole vocabulary from the slices' (max, Z) (top-p alone); the
 *                  nucleus is the shortest prefix with cumulative w >= top_p Z (all K when no
 *                  prefix reaches it), and the token the best l / T + G over the kept prefix.
 * The CPU sums sequentially in double; the CUDA kernels use fixed reduction trees, so a
 * backend is bitwise reproducible and, save the rounding of top-p's Z, independent of the
 * split; the two backends differ only on near-ties of the keys (docs/sampling.md).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"
#include "sampling_internal.h"

#ifdef GDP_HAVE_CUDA
#include "kernels/gdp_kernels.h"
#endif

int64_t gdp_sample_record_words(int32_t max_candidates) {
    if (max_candidates < 1 || max_candidates > GDP_SAMPLING_MAX_CANDIDATES)
        return -1;
    return GDP_SREC_HEADER + 2 * (int64_t)max_candidates;
}

/* ---- argument checks ---------------------------------------------------------------- */

static gdp_status_t check_max_candidates(const char *op, int32_t max_candidates) {
    if (max_candidates < 1 || max_candidates > GDP_SAMPLING_MAX_CANDIDATES)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: max_candidates is %d; use 1 .. %d (GDP_SAMPLING_MAX_CANDIDATES)",
                 op, max_candidates, GDP_SAMPLING_MAX_CANDIDATES);
    return GDP_STATUS_SUCCESS;
}

/* Host rows only (the CPU backend): each row's options must be valid (gdp_sample_row_mode,
 * the rule the kernels apply too) and top_k must fit the record. The CUDA kernels flag such
 * rows instead (GDP_SAMPLE_INVALID_ROW). */
static gdp_status_t check_rows_host(const char *op, const gdp_sample_row *rows, int64_t n_rows,
                                    int32_t max_candidates) {
    for (int64_t r = 0; r < n_rows; r++) {
        if (gdp_sample_row_mode(&rows[r], max_candidates) != GDP_SMODE_INVALID)
            continue;
        const gdp_sampling_params p = {.temperature = rows[r].temperature, .top_k = rows[r].top_k,
                                       .top_p = rows[r].top_p, .seed = rows[r].seed};
        char what[96];
        snprintf(what, sizeof what, "%s: rows[%lld]", op, (long long)r);
        GDP_CHECK(gdp_sampling_params_check(&p, what));
        if (rows[r].top_k > max_candidates)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: rows[%lld].top_k is %d, above max_candidates %d; raise max_candidates (records hold "
                     "top_k candidates per slice)",
                     op, (long long)r, rows[r].top_k, max_candidates);
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: rows[%lld] (temperature %g, top_k %d, top_p %g) is not a valid option set; see "
                 "gdp_sampling_params_check",
                 op, (long long)r, (double)rows[r].temperature, rows[r].top_k, (double)rows[r].top_p);
    }
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t check_candidates_args(const char *op, const gdp_sample_candidates_args *a) {
    if (a->logits == NULL || a->rows == NULL || a->records == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: logits %p, rows %p and records %p must all be non-NULL", op,
                 (const void *)a->logits, (const void *)a->rows, (void *)a->records);
    if (a->n_rows < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: n_rows is %lld; pass at least one row", op, (long long)a->n_rows);
    if (a->n_rows > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: n_rows is %lld; split the batch into calls of at most %d rows",
                 op, (long long)a->n_rows, INT32_MAX);
    if (a->vocab_local < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: vocab_local is %lld; a slice holds at least one token", op,
                 (long long)a->vocab_local);
    if (a->ld < a->vocab_local)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: ld is %lld, below vocab_local %lld; ld is the distance between logits rows, in floats", op,
                 (long long)a->ld, (long long)a->vocab_local);
    if (a->vocab_offset < 0 || a->vocab_offset > INT32_MAX - a->vocab_local)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: vocab_offset %lld + vocab_local %lld must lie in 0 .. %d (token ids are int32)", op,
                 (long long)a->vocab_offset, (long long)a->vocab_local, INT32_MAX);
    return check_max_candidates(op, a->max_candidates);
}

static gdp_status_t check_merge_args(const char *op, const gdp_sample_merge_args *a) {
    if (a->records == NULL || a->rows == NULL || a->out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: records %p, rows %p and out %p must all be non-NULL", op,
                 (const void *)a->records, (const void *)a->rows, (void *)a->out);
    if (a->n_parts < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: n_parts is %d; pass the number of vocabulary slices (>= 1)", op,
                 a->n_parts);
    if (a->n_rows < 1 || a->n_rows > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: n_rows is %lld; use 1 .. %d rows", op, (long long)a->n_rows,
                 INT32_MAX);
    return check_max_candidates(op, a->max_candidates);
}

/* ---- the CPU reference: stage 1 ----------------------------------------------------- */

/* Min-heap of the best keys so far (the worst kept key at the root). */
static void heap_sift_down(uint64_t *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && h[c + 1] < h[c])
            c++;
        if (h[i] <= h[c])
            return;
        const uint64_t t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

static int cmp_key_desc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : (x > y ? -1 : 0);
}

static void cpu_candidates_row(const gdp_sample_candidates_args *a, int64_t r, uint64_t *heap) {
    const float *l = a->logits + r * a->ld;
    const gdp_sample_row *row = &a->rows[r];
    int32_t *rec = a->records + r * gdp_sample_record_words(a->max_candidates);
    const int64_t V = a->vocab_local;
    const uint32_t off = (uint32_t)a->vocab_offset;

    float max = -INFINITY, second = -INFINITY, absmax = 0.0f;
    int64_t argmax = 0;
    int32_t flags = 0;
    for (int64_t i = 0; i < V; i++) {
        const float x = l[i];
        if (!isfinite(x)) {
            flags |= GDP_SAMPLE_NONFINITE;
            continue;
        }
        if (x > max) {
            second = max;
            max = x;
            argmax = i;
        } else if (x > second) {
            second = x;
        }
        absmax = fmaxf(absmax, fabsf(x));
    }
    const int mode = gdp_sample_row_mode(row, a->max_candidates);
    if (mode == GDP_SMODE_INVALID)
        flags |= GDP_SAMPLE_INVALID_ROW;

    double z = 0.0, best_key = 0.0;
    uint32_t best_id = 0;
    int32_t n_cand = 0;
    if (flags == 0 && mode == GDP_SMODE_TEMPERATURE) {
        const double T = row->temperature;
        const uint64_t stream = gdp_sample_stream(row->seed, row->position);
        best_key = -INFINITY;
        for (int64_t i = 0; i < V; i++) {
            const uint32_t id = off + (uint32_t)i;
            const double key = (double)l[i] / T + gdp_sample_gumbel(gdp_sample_bits(stream, id));
            if (key > best_key) {
                best_key = key;
                best_id = id;
            }
        }
    } else if (flags == 0 && mode == GDP_SMODE_CANDIDATES) {
        const int32_t C = gdp_sample_row_candidates(row, a->max_candidates, V);
        for (int64_t i = 0; i < V; i++) {
            const uint64_t key = gdp_sample_key(l[i], off + (uint32_t)i);
            if (i < C) {
                heap[i] = key;
                if (i == C - 1)
                    for (int32_t j = C / 2 - 1; j >= 0; j--)
                        heap_sift_down(heap, C, j);
            } else if (key > heap[0]) {
                heap[0] = key;
                heap_sift_down(heap, C, 0);
            }
        }
        qsort(heap, (size_t)C, sizeof *heap, cmp_key_desc);
        for (int32_t j = 0; j < C; j++) {
            rec[GDP_SREC_HEADER + 2 * j] = (int32_t)gdp_sample_f32_bits(gdp_sample_key_value(heap[j]));
            rec[GDP_SREC_HEADER + 2 * j + 1] = (int32_t)gdp_sample_key_id(heap[j]);
        }
        n_cand = C;
        if (row->top_k == 0) {
            const double T = row->temperature;
            for (int64_t i = 0; i < V; i++)
                z += exp(((double)l[i] - (double)max) / T);
        }
    }
    rec[GDP_SREC_FLAGS] = flags;
    rec[GDP_SREC_ARGMAX] = (int32_t)(off + (uint32_t)argmax);
    rec[GDP_SREC_MAX] = (int32_t)gdp_sample_f32_bits(max);
    rec[GDP_SREC_SECOND] = (int32_t)gdp_sample_f32_bits(second);
    rec[GDP_SREC_ABSMAX] = (int32_t)gdp_sample_f32_bits(absmax);
    rec[GDP_SREC_N_CAND] = n_cand;
    gdp_sample_put_f64(rec + GDP_SREC_Z, z);
    gdp_sample_put_f64(rec + GDP_SREC_GUMBEL_KEY, best_key);
    rec[GDP_SREC_GUMBEL_ID] = (int32_t)best_id;
    rec[GDP_SREC_RESERVED] = 0;
}

static gdp_status_t cpu_sample_candidates(const gdp_sample_candidates_args *a) {
    uint64_t *heap = gdp_calloc((size_t)a->max_candidates, sizeof *heap, "the candidate heap of a sampling row");
    if (heap == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    for (int64_t r = 0; r < a->n_rows; r++)
        cpu_candidates_row(a, r, heap);
    free(heap);
    return GDP_STATUS_SUCCESS;
}

/* ---- the CPU reference: stage 2 ----------------------------------------------------- */

static gdp_sample_out cpu_merge_row(const gdp_sample_merge_args *a, int64_t r, uint64_t *keys, double *cum) {
    const int64_t words = gdp_sample_record_words(a->max_candidates);
    const gdp_sample_row *row = &a->rows[r];
    const int mode = gdp_sample_row_mode(row, a->max_candidates);

    gdp_sample_fold f = gdp_sample_fold_init(mode == GDP_SMODE_INVALID ? GDP_SAMPLE_INVALID_ROW : 0);
    int64_t n_keys = 0;
    for (int32_t p = 0; p < a->n_parts; p++) {
        const int32_t *rec = a->records + ((int64_t)p * a->n_rows + r) * words;
        gdp_sample_fold_part(&f, rec);
        int32_t n = rec[GDP_SREC_N_CAND];
        n = n < 0 ? 0 : (n > a->max_candidates ? a->max_candidates : n);
        for (int32_t j = 0; j < n; j++)
            keys[n_keys++] = gdp_sample_key(gdp_sample_f32_from_bits((uint32_t)rec[GDP_SREC_HEADER + 2 * j]),
                                            (uint32_t)rec[GDP_SREC_HEADER + 2 * j + 1]);
    }
    if (f.flags & GDP_SAMPLE_INVALID_ROW)
        return (gdp_sample_out){.token = 0, .margin = 0.0f, .scale = 0.0f, .flags = f.flags};
    if (f.flags & GDP_SAMPLE_NONFINITE)
        return (gdp_sample_out){.token = 0, .margin = 0.0f, .scale = INFINITY, .flags = f.flags};

    gdp_sample_out out = {.token = (int32_t)f.argmax, .margin = f.max - f.second, .scale = f.absmax, .flags = 0};
    if (mode == GDP_SMODE_TEMPERATURE) {
        out.token = (int32_t)f.best_id;
    } else if (mode == GDP_SMODE_CANDIDATES && n_keys > 0) {
        const double T = row->temperature, M = f.max;
        qsort(keys, (size_t)n_keys, sizeof *keys, cmp_key_desc);
        const int64_t K_cap = row->top_k > 0 ? row->top_k : a->max_candidates;
        const int64_t K = n_keys < K_cap ? n_keys : K_cap;
        double total = 0.0;
        for (int64_t i = 0; i < K; i++) {
            total += exp(((double)gdp_sample_key_value(keys[i]) - M) / T);
            cum[i] = total;
        }
        double Z = total;
        if (row->top_k == 0) { /* top-p alone: the whole vocabulary's Z from the slices' (max, Z) */
            Z = 0.0;
            for (int32_t p = 0; p < a->n_parts; p++) {
                const int32_t *rec = a->records + ((int64_t)p * a->n_rows + r) * words;
                const double m = gdp_sample_f32_from_bits((uint32_t)rec[GDP_SREC_MAX]);
                Z += gdp_sample_get_f64(rec + GDP_SREC_Z) * exp((m - M) / T);
            }
        }
        int64_t keep = K;
        const float top_p = gdp_sample_row_top_p(row);
        if (top_p < 1.0f) {
            const double target = (double)top_p * Z;
            for (int64_t i = 0; i < K; i++)
                if (cum[i] >= target) {
                    keep = i + 1;
                    break;
                }
        }
        const uint64_t stream = gdp_sample_stream(row->seed, row->position);
        double best = -INFINITY;
        uint32_t tok = gdp_sample_key_id(keys[0]);
        for (int64_t i = 0; i < keep; i++) { /* equal Gumbel keys (rare) go to the smaller id */
            const uint32_t id = gdp_sample_key_id(keys[i]);
            const double key = (double)gdp_sample_key_value(keys[i]) / T + gdp_sample_gumbel(gdp_sample_bits(stream, id));
            if (key > best || (key == best && id < tok)) {
                best = key;
                tok = id;
            }
        }
        out.token = (int32_t)tok;
    }
    return out;
}

static gdp_status_t cpu_sample_merge(const gdp_sample_merge_args *a) {
    const size_t n = (size_t)a->n_parts * (size_t)a->max_candidates;
    uint64_t *keys = gdp_calloc(n, sizeof *keys, "the merged candidates of a sampling row");
    double *cum = gdp_calloc(n, sizeof *cum, "the cumulative weights of a sampling row");
    if (keys == NULL || cum == NULL) {
        free(keys);
        free(cum);
        return GDP_STATUS_SYSTEM_ERROR;
    }
    for (int64_t r = 0; r < a->n_rows; r++)
        a->out[r] = cpu_merge_row(a, r, keys, cum);
    free(keys);
    free(cum);
    return GDP_STATUS_SUCCESS;
}

/* ---- the public front-ends ---------------------------------------------------------- */

gdp_status_t gdp_sample_candidates(gdp_ctx_t ctx, const gdp_sample_candidates_args *args) {
    static const char *op = "gdp_sample_candidates";
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if (args == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: args is NULL; pass a filled gdp_sample_candidates_args", op);
    GDP_CHECK(check_candidates_args(op, args));
    if (ctx->backend == GDP_BACKEND_CUDA) {
        GDP_CUDA_OP(op, gdp_cuda_sample_candidates(ctx, args));
    }
    GDP_CHECK(check_rows_host(op, args->rows, args->n_rows, args->max_candidates));
    return cpu_sample_candidates(args);
}

gdp_status_t gdp_sample_merge(gdp_ctx_t ctx, const gdp_sample_merge_args *args) {
    static const char *op = "gdp_sample_merge";
    GDP_CHECK(gdp_ctx_check(ctx, op));
    if (args == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: args is NULL; pass a filled gdp_sample_merge_args", op);
    GDP_CHECK(check_merge_args(op, args));
    if (ctx->backend == GDP_BACKEND_CUDA) {
        GDP_CUDA_OP(op, gdp_cuda_sample_merge(ctx, args));
    }
    GDP_CHECK(check_rows_host(op, args->rows, args->n_rows, args->max_candidates));
    return cpu_sample_merge(args);
}
