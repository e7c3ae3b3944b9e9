/*
 * test_sampling.c: gdp_sample_candidates + gdp_sample_merge (include/gdp/sampling.h) on one
 * backend: the CPU reference (test_sampling, label cpu) or, built with
 * GDP_TEST_SAMPLING_GPU, the CUDA kernels (test_sampling_gpu, label gpu; exit 77 without a
 * GPU). Both variants check:
 *   greedy: the token, margin and scale of a host argmax over random rows (vocab 1 .. 50000,
 *           split or not); ties to the smaller id, also when the slices come in another
 *           order; NaN / Inf set the flag and leave the other rows alone;
 *   chi-square: >= 20,000 draws (positions or seeds varied) from fixed logits for
 *           temperature 0.7 and 1.5, top-k 5, top-p 0.8, top-k + top-p and a wide top-p,
 *           against the exact target distribution in double (tokens outside it never
 *           drawn); the bound is the p = 1e-6 quantile (Wilson-Hilferty, computed);
 *   vocab-parallel invariance: 2, 3 and 4 slices (uneven, permuted) give exactly the out of
 *           one slice, for every mode, max_candidates 1024 and 64, vocab 10007 and 151936,
 *           rows of random, equal, clustered and tied logits;
 *   batch invariance: each row alone and the batch reversed give the same outs;
 *   reproducibility: two runs give the same records and outs, bitwise;
 *   bad arguments: refused with nothing written.
 * The GPU variant also requires: stage-1 records equal to the CPU's (candidates and stats
 * bitwise, Z within 1e-5), greedy tokens equal to the CPU's, sampled tokens equal to the
 * CPU's but for near-ties (at most 1 in 1000), rows with invalid options flagged, and a
 * captured CUDA graph replaying to the eager bits. `test_sampling_gpu --bench` times stage
 * 1 + 2 (CUDA events, median of 20).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdp/sampling.h"
#include "sampling_internal.h" /* the record layout, to compare records across backends */
#include "test_common.h"

#if defined(GDP_TEST_SAMPLING_GPU) && defined(GDP_HAVE_CUDA)
#define ON_GPU 1
#include "test_gpu.h" /* CUDA_OK, the job's contexts and blocking stream g_test_stream */
#else
#define ON_GPU 0
#endif

static gdp_ctx_t g_ctx; /* the backend under test             */
static gdp_ctx_t g_cpu; /* the CPU reference (g_ctx on the CPU) */

#define MAXC GDP_SAMPLING_MAX_CANDIDATES

/* ---- backend memory ------------------------------------------------------------------ */

#if ON_GPU
static bool is_gpu(gdp_ctx_t ctx) {
    gdp_backend_t b = GDP_BACKEND_CPU;
    gdp_ctx_get_backend(ctx, &b);
    return b == GDP_BACKEND_CUDA;
}
#endif

/* Zero-filled backend memory. */
static void *bmem_alloc(gdp_ctx_t ctx, size_t bytes) {
#if ON_GPU
    if (is_gpu(ctx)) {
        void *p = NULL;
        CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
        CUDA_OK(cudaMemset(p, 0, bytes ? bytes : 1));
        return p;
    }
#endif
    (void)ctx;
    return calloc(1, bytes ? bytes : 1);
}
static void bmem_free(gdp_ctx_t ctx, void *p) {
#if ON_GPU
    if (is_gpu(ctx)) {
        CUDA_OK(cudaFree(p));
        return;
    }
#endif
    (void)ctx;
    free(p);
}
static void bmem_put(gdp_ctx_t ctx, void *dst, const void *src, size_t bytes) {
#if ON_GPU
    if (is_gpu(ctx)) {
        CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
        return;
    }
#endif
    (void)ctx;
    memcpy(dst, src, bytes);
}
static void bmem_get(gdp_ctx_t ctx, void *dst, const void *src, size_t bytes) {
#if ON_GPU
    if (is_gpu(ctx)) {
        CUDA_OK(cudaStreamSynchronize(g_test_stream));
        CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
        return;
    }
#endif
    (void)ctx;
    memcpy(dst, src, bytes);
}

/* ---- running both stages ------------------------------------------------------------- */

/* Vocabulary slices in record order (not necessarily ascending offsets). */
typedef struct {
    int32_t n;
    int64_t off[8], len[8];
} split_t;

static split_t split_whole(int64_t V) { return (split_t){.n = 1, .off = {0}, .len = {V}}; }

/* n slices; uneven (the first of one token when V allows) and, when permute, in reverse order. */
static split_t split_parts(int64_t V, int32_t n, bool uneven, bool permute) {
    split_t s = {.n = n};
    int64_t cut[9];
    cut[0] = 0;
    cut[n] = V;
    for (int32_t p = 1; p < n; p++)
        cut[p] = V * p / n;
    if (uneven && n >= 3 && V > 2 * n) {
        cut[1] = 1;
        cut[2] = V / 2 + 3;
    }
    for (int32_t p = 0; p < n; p++) {
        const int32_t q = permute ? n - 1 - p : p;
        s.off[p] = cut[q];
        s.len[p] = cut[q + 1] - cut[q];
    }
    return s;
}

typedef struct {
    const float *logits; /* host [n_rows, ld] */
    int64_t n_rows, V, ld;
    const gdp_sample_row *rows; /* host [n_rows] */
    int32_t max_candidates;
} problem;

/* Stage 1 on every slice, stage 2, on ctx; out (host [n_rows]) and, when records is not NULL,
 * the records (host [n_parts, n_rows, words]). */
static bool run_sampling(gdp_ctx_t ctx, const problem *pb, const split_t *sp, gdp_sample_out *out, int32_t *records) {
    const int64_t words = gdp_sample_record_words(pb->max_candidates);
    const size_t logit_bytes = (size_t)(pb->n_rows * pb->ld) * sizeof(float);
    const size_t rec_bytes = (size_t)(sp->n * pb->n_rows * words) * sizeof(int32_t);
    float *d_logits = bmem_alloc(ctx, logit_bytes);
    gdp_sample_row *d_rows = bmem_alloc(ctx, (size_t)pb->n_rows * sizeof *d_rows);
    int32_t *d_rec = bmem_alloc(ctx, rec_bytes);
    gdp_sample_out *d_out = bmem_alloc(ctx, (size_t)pb->n_rows * sizeof *d_out);
    bmem_put(ctx, d_logits, pb->logits, logit_bytes);
    bmem_put(ctx, d_rows, pb->rows, (size_t)pb->n_rows * sizeof *d_rows);
    bool ok = true;
    for (int32_t p = 0; p < sp->n && ok; p++) {
        const gdp_sample_candidates_args a = {.logits = d_logits + sp->off[p],
                                              .n_rows = pb->n_rows,
                                              .vocab_local = sp->len[p],
                                              .ld = pb->ld,
                                              .vocab_offset = sp->off[p],
                                              .rows = d_rows,
                                              .max_candidates = pb->max_candidates,
                                              .records = d_rec + p * pb->n_rows * words};
        const gdp_status_t st = gdp_sample_candidates(ctx, &a);
        CHECK(st == GDP_STATUS_SUCCESS, "gdp_sample_candidates (slice %d of %d): %s", p, sp->n, gdp_last_error());
        ok = st == GDP_STATUS_SUCCESS;
    }
    if (ok) {
        const gdp_sample_merge_args m = {.records = d_rec,
                                         .n_parts = sp->n,
                                         .n_rows = pb->n_rows,
                                         .max_candidates = pb->max_candidates,
                                         .rows = d_rows,
                                         .out = d_out};
        const gdp_status_t st = gdp_sample_merge(ctx, &m);
        CHECK(st == GDP_STATUS_SUCCESS, "gdp_sample_merge (%d slices): %s", sp->n, gdp_last_error());
        ok = st == GDP_STATUS_SUCCESS;
    }
    if (ok) {
        bmem_get(ctx, out, d_out, (size_t)pb->n_rows * sizeof *out);
        if (records)
            bmem_get(ctx, records, d_rec, rec_bytes);
    }
    bmem_free(ctx, d_logits);
    bmem_free(ctx, d_rows);
    bmem_free(ctx, d_rec);
    bmem_free(ctx, d_out);
    return ok;
}

static gdp_sample_row mkrow(float temperature, int32_t top_k, float top_p, int32_t position, uint64_t seed) {
    return (gdp_sample_row){.temperature = temperature, .top_k = top_k, .top_p = top_p, .position = position,
                            .seed = seed};
}

static bool same_out(const gdp_sample_out *a, const gdp_sample_out *b) { return memcmp(a, b, sizeof *a) == 0; }

/* ---- greedy --------------------------------------------------------------------------- */

static void host_top2(const float *l, int64_t V, int32_t *argmax, float *margin, float *scale) {
    float m = -INFINITY, s = -INFINITY, a = 0.0f;
    int64_t am = 0;
    for (int64_t i = 0; i < V; i++) {
        if (l[i] > m) {
            s = m;
            m = l[i];
            am = i;
        } else if (l[i] > s) {
            s = l[i];
        }
        a = fmaxf(a, fabsf(l[i]));
    }
    *argmax = (int32_t)am;
    *margin = m - s;
    *scale = a;
}

static void test_greedy(test_rng *rng) {
    static const int64_t vocabs[] = {1, 2, 7, 1000, 50000};
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        const int64_t V = vocabs[vi], n_rows = 24, ld = V + 3; /* ld > V: unaligned rows */
        float *l = malloc((size_t)(n_rows * ld) * sizeof *l);
        gdp_sample_row rows[24];
        for (int64_t r = 0; r < n_rows; r++) {
            for (int64_t i = 0; i < ld; i++)
                l[r * ld + i] = (float)(test_normal(rng) * 4.0);
            /* temperature 0 makes top-k / top-p irrelevant */
            rows[r] = mkrow(0.0f, (int32_t)(r % 3) * 7, r % 2 ? 0.5f : 1.0f, (int32_t)r, 99);
        }
        if (V >= 1000) { /* ties: the max twice (the smaller id wins, margin 0) */
            l[1 * ld + 700] = l[1 * ld + 300] = 100.0f;
            l[2 * ld + 999] = l[2 * ld + 0] = 100.0f;
        }
        const problem pb = {l, n_rows, V, ld, rows, MAXC};
        gdp_sample_out out[24];
        const int32_t max_parts = V >= 4 ? 4 : (int32_t)V;
        for (int32_t n = 1; n <= max_parts; n++) {
            for (int perm = 0; perm < 2; perm++) {
                const split_t sp = n == 1 ? split_whole(V) : split_parts(V, n, n == 3, perm == 1);
                if (!run_sampling(g_ctx, &pb, &sp, out, NULL))
                    continue;
                for (int64_t r = 0; r < n_rows; r++) {
                    int32_t tok;
                    float margin, scale;
                    host_top2(l + r * ld, V, &tok, &margin, &scale);
                    CHECK(out[r].token == tok && out[r].flags == 0,
                          "greedy V %lld, %d slices, row %lld: token %d flags %d, want %d", (long long)V, n,
                          (long long)r, out[r].token, out[r].flags, tok);
                    CHECK(out[r].margin == margin && out[r].scale == scale,
                          "greedy V %lld, %d slices, row %lld: margin %g scale %g, want %g %g", (long long)V, n,
                          (long long)r, out[r].margin, out[r].scale, margin, scale);
                }
                if (V >= 1000) {
                    CHECK(out[1].token == 300 && out[1].margin == 0.0f, "tie: token %d margin %g, want 300, 0",
                          out[1].token, out[1].margin);
                    CHECK(out[2].token == 0 && out[2].margin == 0.0f, "tie: token %d margin %g, want 0, 0",
                          out[2].token, out[2].margin);
                }
                if (V == 1)
                    CHECK(isinf(out[0].margin) && out[0].margin > 0, "vocab of 1: margin %g, want +inf",
                          out[0].margin);
            }
        }
        free(l);
    }
}

/* NaN / +Inf / -Inf rows: flagged, token 0; the rows beside them as when computed alone. */
static void test_nonfinite(test_rng *rng) {
    const int64_t V = 3001, n_rows = 6;
    float *l = malloc((size_t)(n_rows * V) * sizeof *l);
    for (int64_t i = 0; i < n_rows * V; i++)
        l[i] = (float)test_normal(rng);
    l[1 * V + 17] = NAN;
    l[3 * V + 3000] = INFINITY;
    l[5 * V + 2] = -INFINITY;
    gdp_sample_row rows[6];
    for (int64_t r = 0; r < n_rows; r++)
        rows[r] = mkrow(r < 2 ? 0.0f : 0.8f, r >= 4 ? 20 : 0, r == 3 || r == 5 ? 0.9f : 1.0f, (int32_t)r, 5);
    const problem pb = {l, n_rows, V, V, rows, MAXC};
    gdp_sample_out out[6], one;
    const split_t sp = split_parts(V, 2, false, false);
    if (!run_sampling(g_ctx, &pb, &sp, out, NULL))
        goto done;
    for (int64_t r = 0; r < n_rows; r++) {
        const bool bad = r == 1 || r == 3 || r == 5;
        if (bad) {
            CHECK(out[r].flags == GDP_SAMPLE_NONFINITE && out[r].token == 0,
                  "non-finite row %lld: flags %d token %d, want %d, 0", (long long)r, out[r].flags, out[r].token,
                  GDP_SAMPLE_NONFINITE);
        } else {
            const problem alone = {l + r * V, 1, V, V, rows + r, MAXC};
            if (run_sampling(g_ctx, &alone, &sp, &one, NULL))
                CHECK(same_out(&out[r], &one) && out[r].flags == 0,
                      "row %lld beside non-finite rows: token %d flags %d, alone %d", (long long)r, out[r].token,
                      out[r].flags, one.token);
        }
    }
done:
    free(l);
}

/* ---- chi-square goodness of fit ------------------------------------------------------ */

static const float *g_sort_logits;
static int cmp_logit_desc(const void *a, const void *b) {
    const int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    const float x = g_sort_logits[i], y = g_sort_logits[j];
    if (x != y)
        return x > y ? -1 : 1;
    return i < j ? -1 : (i > j ? 1 : 0);
}

/* The exact target distribution of sampling.h's definition, in double. */
static void target_distribution(const float *l, int64_t V, float T, int32_t top_k, float top_p, int32_t max_c,
                                double *prob) {
    int64_t *order = malloc((size_t)V * sizeof *order);
    double *w = malloc((size_t)V * sizeof *w);
    for (int64_t i = 0; i < V; i++)
        order[i] = i;
    g_sort_logits = l;
    qsort(order, (size_t)V, sizeof *order, cmp_logit_desc);
    const double lmax = l[order[0]];
    double z_all = 0.0;
    for (int64_t i = 0; i < V; i++) {
        w[i] = exp(((double)l[order[i]] - lmax) / T);
        z_all += w[i];
    }
    int64_t K = V;
    if (top_k > 0 || top_p < 1.0f) {
        const int64_t cap = top_k > 0 ? top_k : max_c;
        K = cap < V ? cap : V;
    }
    double z = z_all;
    if (top_k > 0) {
        z = 0.0;
        for (int64_t i = 0; i < K; i++)
            z += w[i];
    }
    int64_t keep = K;
    if (top_p < 1.0f) {
        double cum = 0.0;
        for (int64_t i = 0; i < K; i++) {
            cum += w[i];
            if (cum >= (double)top_p * z) {
                keep = i + 1;
                break;
            }
        }
    }
    double kept = 0.0;
    for (int64_t i = 0; i < keep; i++)
        kept += w[i];
    for (int64_t i = 0; i < V; i++)
        prob[i] = 0.0;
    for (int64_t i = 0; i < keep; i++)
        prob[order[i]] = w[i] / kept;
    free(order);
    free(w);
}

/* The upper p-quantile of chi-square with df degrees of freedom: Wilson-Hilferty, with the
 * normal quantile z solved from erfc by bisection. */
static double chi2_critical(int64_t df, double p) {
    double lo = 0.0, hi = 40.0;
    for (int it = 0; it < 200; it++) {
        const double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(mid / sqrt(2.0)) > p)
            lo = mid;
        else
            hi = mid;
    }
    const double z = 0.5 * (lo + hi), k = (double)df, c = 2.0 / (9.0 * k);
    const double t = 1.0 - c + z * sqrt(c);
    return k * t * t * t;
}

/* Pearson's statistic over bins with expected count >= 5, the rest pooled into one bin. */
static bool chi_square_ok(const char *what, const int64_t *count, const double *prob, int64_t V, int64_t N) {
    double stat = 0.0, pooled_e = 0.0;
    int64_t pooled_o = 0, bins = 0, outside = 0;
    for (int64_t i = 0; i < V; i++) {
        const double e = prob[i] * (double)N;
        if (prob[i] == 0.0) {
            outside += count[i];
            continue;
        }
        if (e >= 5.0) {
            stat += ((double)count[i] - e) * ((double)count[i] - e) / e;
            bins++;
        } else {
            pooled_e += e;
            pooled_o += count[i];
        }
    }
    if (pooled_e > 0.0) {
        stat += ((double)pooled_o - pooled_e) * ((double)pooled_o - pooled_e) / pooled_e;
        bins++;
    }
    CHECK(outside == 0, "%s: %lld draws of tokens outside the target distribution", what, (long long)outside);
    if (bins < 2) { /* one token kept: every draw must be it */
        CHECK(outside == 0, "%s", what);
        printf("  %-34s one token kept, %lld draws\n", what, (long long)N);
        return outside == 0;
    }
    const double crit = chi2_critical(bins - 1, 1e-6);
    printf("  %-34s chi2 %9.2f  df %4lld  bound(p=1e-6) %8.2f\n", what, stat, (long long)(bins - 1), crit);
    CHECK(stat < crit, "%s: chi-square %.2f >= %.2f (df %lld, p = 1e-6)", what, stat, crit, (long long)(bins - 1));
    return stat < crit && outside == 0;
}

static void test_chi_square(test_rng *rng) {
    typedef struct {
        const char *name;
        int64_t V;
        float T;
        int32_t top_k;
        float top_p;
        bool vary_seed; /* else vary the position */
        int32_t n_parts;
    } mode_t_;
    static const mode_t_ modes[] = {
        {"temperature 0.7", 40, 0.7f, 0, 1.0f, false, 1},
        {"temperature 1.5 (seeds)", 40, 1.5f, 0, 1.0f, true, 2},
        {"top-k 5", 40, 1.0f, 5, 1.0f, false, 1},
        {"top-p 0.8", 40, 1.0f, 0, 0.8f, true, 1},
        {"top-k 10 + top-p 0.7, T 0.9", 40, 0.9f, 10, 0.7f, false, 3},
        {"top-p 0.5, vocab 3000 (slices)", 3000, 1.0f, 0, 0.5f, false, 2},
    };
    const int64_t N = 20000;
    gdp_sample_row *rows = malloc((size_t)N * sizeof *rows);
    gdp_sample_out *out = malloc((size_t)N * sizeof *out);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        const mode_t_ *md = &modes[m];
        const int64_t V = md->V;
        float *one = malloc((size_t)V * sizeof *one);
        for (int64_t i = 0; i < V; i++)
            one[i] = V <= 64 ? (float)(test_normal(rng) * 1.5) : (float)test_uniform_range(rng, 0.0, 4.0);
        float *l = malloc((size_t)(N * V) * sizeof *l);
        for (int64_t r = 0; r < N; r++) {
            memcpy(l + r * V, one, (size_t)V * sizeof *l);
            rows[r] = md->vary_seed ? mkrow(md->T, md->top_k, md->top_p, 7, 0x5eed0000ull + (uint64_t)r)
                                    : mkrow(md->T, md->top_k, md->top_p, (int32_t)r, 0xc0ffee + m);
        }
        const problem pb = {l, N, V, V, rows, MAXC};
        const split_t sp = md->n_parts == 1 ? split_whole(V) : split_parts(V, md->n_parts, true, true);
        if (run_sampling(g_ctx, &pb, &sp, out, NULL)) {
            int64_t *count = calloc((size_t)V, sizeof *count);
            double *prob = malloc((size_t)V * sizeof *prob);
            int64_t bad_token = 0;
            for (int64_t r = 0; r < N; r++) {
                if (out[r].token >= 0 && out[r].token < V && out[r].flags == 0)
                    count[out[r].token]++;
                else
                    bad_token++;
            }
            CHECK(bad_token == 0, "%s: %lld outs with a bad token or flags", md->name, (long long)bad_token);
            target_distribution(one, V, md->T, md->top_k, md->top_p, MAXC, prob);
            chi_square_ok(md->name, count, prob, V, N);
            free(count);
            free(prob);
        }
        free(l);
        free(one);
    }
    free(rows);
    free(out);
}

/* ---- invariance and reproducibility --------------------------------------------------- */

typedef struct {
    float T;
    int32_t top_k;
    float top_p;
} opts;

static const opts k_modes[] = {
    {0.0f, 0, 1.0f},  {0.7f, 0, 1.0f},   {1.3f, 0, 1.0f},  {1.0f, 1, 1.0f},   {1.0f, 5, 1.0f},
    {0.8f, 50, 1.0f}, {1.0f, 0, 0.8f},   {2.0f, 0, 0.95f}, {1.0f, 20, 0.6f},  {0.5f, 1024, 1.0f},
    {1.0f, 64, 0.9f}, {3.0f, 0, 0.999f}, {0.0f, 5, 0.5f},  {0.9f, 0, 0.0f},   {1.0f, 7, 0.0f},
};
#define N_MODES ((int64_t)(sizeof k_modes / sizeof k_modes[0]))

/* Row logits: 0 random normal, 1 all equal, 2 clustered (7 neighbouring floats), 3 uniform,
 * 4 ties (half-integers). */
static void fill_row(test_rng *rng, float *l, int64_t V, int kind) {
    for (int64_t i = 0; i < V; i++) {
        switch (kind) {
        case 0: l[i] = (float)(test_normal(rng) * 3.0); break;
        case 1: l[i] = 0.0f; break;
        case 2: l[i] = 1.0f + (float)(i % 7) * 1.1920929e-7f; break;
        case 3: l[i] = (float)test_uniform_range(rng, -10.0, 10.0); break;
        default: l[i] = (float)(round(test_normal(rng) * 4.0) / 2.0); break;
        }
    }
}

typedef struct {
    float *l;
    gdp_sample_row *rows;
    problem pb;
} batch;

/* Every logits kind x every mode valid for max_c (top_k <= max_c). */
static batch make_batch(test_rng *rng, int64_t V, int32_t max_c, int kinds) {
    batch b;
    int64_t n = 0;
    b.l = malloc((size_t)(kinds * N_MODES * V) * sizeof *b.l);
    b.rows = malloc((size_t)(kinds * N_MODES) * sizeof *b.rows);
    for (int kind = 0; kind < kinds; kind++)
        for (int64_t m = 0; m < N_MODES; m++) {
            if (k_modes[m].top_k > max_c)
                continue;
            fill_row(rng, b.l + n * V, V, kind);
            b.rows[n] = mkrow(k_modes[m].T, k_modes[m].top_k, k_modes[m].top_p, (int32_t)(n * 13 + 1),
                              0xabcdef12345ull + (uint64_t)n * 7919);
            n++;
        }
    b.pb = (problem){b.l, n, V, V, b.rows, max_c};
    return b;
}

static void free_batch(batch *b) {
    free(b->l);
    free(b->rows);
}

static void test_split_invariance(test_rng *rng) {
    static const struct {
        int64_t V;
        int32_t max_c;
        int kinds;
    } cases[] = {{10007, MAXC, 5}, {10007, 64, 5}, {151936, MAXC, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        batch b = make_batch(rng, cases[c].V, cases[c].max_c, cases[c].kinds);
        const int64_t n = b.pb.n_rows, V = cases[c].V;
        gdp_sample_out *ref = malloc((size_t)n * sizeof *ref), *got = malloc((size_t)n * sizeof *got);
        const split_t whole = split_whole(V);
        if (run_sampling(g_ctx, &b.pb, &whole, ref, NULL)) {
            for (int64_t r = 0; r < n; r++)
                CHECK(ref[r].flags == 0 && ref[r].token >= 0 && ref[r].token < V, "row %lld: token %d flags %d",
                      (long long)r, ref[r].token, ref[r].flags);
            for (int32_t parts = 2; parts <= 4; parts++) {
                const split_t sp = split_parts(V, parts, parts == 3, parts == 4);
                if (!run_sampling(g_ctx, &b.pb, &sp, got, NULL))
                    continue;
                int64_t diff = 0, first = -1;
                for (int64_t r = 0; r < n; r++)
                    if (!same_out(&ref[r], &got[r])) {
                        if (first < 0)
                            first = r;
                        diff++;
                    }
                CHECK(diff == 0,
                      "V %lld max_candidates %d, %d slices: %lld of %lld rows differ from one slice; first row "
                      "%lld (T %g top_k %d top_p %g): token %d vs %d",
                      (long long)V, cases[c].max_c, parts, (long long)diff, (long long)n, (long long)first,
                      first >= 0 ? b.rows[first].temperature : 0.0, first >= 0 ? b.rows[first].top_k : 0,
                      first >= 0 ? b.rows[first].top_p : 0.0, first >= 0 ? got[first].token : 0,
                      first >= 0 ? ref[first].token : 0);
            }
            /* equal logits: top-k 5 can only draw ids 0 .. 4 (ties go to the smaller ids) */
            for (int64_t r = 0; r < n; r++) {
                bool all_zero = true;
                for (int64_t i = 0; i < V && all_zero; i++)
                    all_zero = b.l[r * V + i] == 0.0f;
                if (all_zero && b.rows[r].top_k == 5 && b.rows[r].temperature > 0)
                    CHECK(ref[r].token < 5, "equal logits, top-k 5: token %d, want < 5", ref[r].token);
            }
        }
        free(ref);
        free(got);
        free_batch(&b);
    }
}

static void test_batch_invariance(test_rng *rng) {
    batch b = make_batch(rng, 4099, MAXC, 5);
    const int64_t n = b.pb.n_rows, V = b.pb.V;
    gdp_sample_out *ref = malloc((size_t)n * sizeof *ref), *got = malloc((size_t)n * sizeof *got);
    const split_t sp = split_parts(V, 2, false, false);
    if (run_sampling(g_ctx, &b.pb, &sp, ref, NULL)) {
        int64_t diff = 0;
        for (int64_t r = 0; r < n; r++) {
            const problem alone = {b.l + r * V, 1, V, V, b.rows + r, MAXC};
            if (run_sampling(g_ctx, &alone, &sp, &got[r], NULL) && !same_out(&ref[r], &got[r]))
                diff++;
        }
        CHECK(diff == 0, "%lld of %lld rows sampled alone differ from the batch", (long long)diff, (long long)n);
        /* the batch reversed: row r moves to n - 1 - r */
        float *lr = malloc((size_t)(n * V) * sizeof *lr);
        gdp_sample_row *rr = malloc((size_t)n * sizeof *rr);
        for (int64_t r = 0; r < n; r++) {
            memcpy(lr + (n - 1 - r) * V, b.l + r * V, (size_t)V * sizeof *lr);
            rr[n - 1 - r] = b.rows[r];
        }
        const problem rev = {lr, n, V, V, rr, MAXC};
        diff = 0;
        if (run_sampling(g_ctx, &rev, &sp, got, NULL))
            for (int64_t r = 0; r < n; r++)
                diff += !same_out(&ref[r], &got[n - 1 - r]);
        CHECK(diff == 0, "%lld of %lld rows differ when the batch is reversed", (long long)diff, (long long)n);
        free(lr);
        free(rr);
    }
    free(ref);
    free(got);
    free_batch(&b);
}

static void test_reproducible(test_rng *rng) {
    batch b = make_batch(rng, 20011, MAXC, 5);
    const int64_t n = b.pb.n_rows, words = gdp_sample_record_words(MAXC);
    const split_t sp = split_parts(b.pb.V, 3, true, false);
    const size_t rec_n = (size_t)(sp.n * n * words);
    int32_t *rec1 = malloc(rec_n * sizeof *rec1), *rec2 = malloc(rec_n * sizeof *rec2);
    gdp_sample_out *o1 = malloc((size_t)n * sizeof *o1), *o2 = malloc((size_t)n * sizeof *o2);
    if (run_sampling(g_ctx, &b.pb, &sp, o1, rec1) && run_sampling(g_ctx, &b.pb, &sp, o2, rec2)) {
        CHECK(memcmp(rec1, rec2, rec_n * sizeof *rec1) == 0, "two runs: the records differ");
        CHECK(memcmp(o1, o2, (size_t)n * sizeof *o1) == 0, "two runs: the outs differ");
    }
    free(rec1);
    free(rec2);
    free(o1);
    free(o2);
    free_batch(&b);
}

/* ---- bad arguments ------------------------------------------------------------------- */

static void test_bad_args(void) {
    CHECK(gdp_sample_record_words(1) == GDP_SREC_HEADER + 2, "record words of 1: %lld",
          (long long)gdp_sample_record_words(1));
    CHECK(gdp_sample_record_words(0) == -1 && gdp_sample_record_words(MAXC + 1) == -1,
          "record words outside 1 .. %d must be -1", MAXC);

    const int64_t V = 100, n_rows = 2, words = gdp_sample_record_words(16);
    float hl[200];
    for (int i = 0; i < 200; i++)
        hl[i] = (float)i;
    gdp_sample_row hrows[2] = {mkrow(1.0f, 8, 1.0f, 0, 1), mkrow(0.0f, 0, 1.0f, 0, 1)};
    float *l = bmem_alloc(g_ctx, sizeof hl);
    gdp_sample_row *rows = bmem_alloc(g_ctx, sizeof hrows);
    int32_t *rec = bmem_alloc(g_ctx, (size_t)(n_rows * words) * sizeof *rec);
    gdp_sample_out *out = bmem_alloc(g_ctx, (size_t)n_rows * sizeof *out);
    bmem_put(g_ctx, l, hl, sizeof hl);
    bmem_put(g_ctx, rows, hrows, sizeof hrows);
    int32_t *sentinel = malloc((size_t)(n_rows * words) * sizeof *sentinel), *back = malloc((size_t)(n_rows * words) * sizeof *back);
    for (int64_t i = 0; i < n_rows * words; i++)
        sentinel[i] = 0x5a5a5a5a;
    bmem_put(g_ctx, rec, sentinel, (size_t)(n_rows * words) * sizeof *rec);
    bmem_put(g_ctx, out, sentinel, (size_t)n_rows * sizeof *out);

    const gdp_sample_candidates_args good = {.logits = l, .n_rows = n_rows, .vocab_local = V, .ld = V,
                                             .vocab_offset = 0, .rows = rows, .max_candidates = 16, .records = rec};
    gdp_sample_candidates_args a;
#define BAD_CAND(field, value)                                                                                  \
    do {                                                                                                        \
        a = good;                                                                                               \
        a.field = value;                                                                                        \
        CHECK_STATUS(gdp_sample_candidates(g_ctx, &a), GDP_STATUS_INVALID_ARGUMENT);                            \
    } while (0)
    BAD_CAND(logits, NULL);
    BAD_CAND(rows, NULL);
    BAD_CAND(records, NULL);
    BAD_CAND(n_rows, 0);
    BAD_CAND(vocab_local, 0);
    BAD_CAND(ld, V - 1);
    BAD_CAND(vocab_offset, -1);
    BAD_CAND(vocab_offset, (int64_t)INT32_MAX);
    BAD_CAND(max_candidates, 0);
    BAD_CAND(max_candidates, MAXC + 1);
    CHECK_STATUS(gdp_sample_candidates(g_ctx, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(gdp_sample_candidates(NULL, &good) != GDP_STATUS_SUCCESS, "a NULL ctx must be refused");

    const gdp_sample_merge_args mgood = {.records = rec, .n_parts = 1, .n_rows = n_rows, .max_candidates = 16,
                                         .rows = rows, .out = out};
    gdp_sample_merge_args m;
#define BAD_MERGE(field, value)                                                                                 \
    do {                                                                                                        \
        m = mgood;                                                                                              \
        m.field = value;                                                                                        \
        CHECK_STATUS(gdp_sample_merge(g_ctx, &m), GDP_STATUS_INVALID_ARGUMENT);                                 \
    } while (0)
    BAD_MERGE(records, NULL);
    BAD_MERGE(rows, NULL);
    BAD_MERGE(out, NULL);
    BAD_MERGE(n_parts, 0);
    BAD_MERGE(n_rows, 0);
    BAD_MERGE(max_candidates, 0);
    BAD_MERGE(max_candidates, MAXC + 1);
    CHECK_STATUS(gdp_sample_merge(g_ctx, NULL), GDP_STATUS_INVALID_ARGUMENT);

    /* A row with top_k above max_candidates (and one with a negative temperature). */
    gdp_sample_row bad_rows[2] = {mkrow(1.0f, 17, 1.0f, 0, 1), mkrow(-1.0f, 0, 1.0f, 0, 1)};
    bmem_put(g_ctx, rows, bad_rows, sizeof bad_rows);
    if (!ON_GPU) {
        CHECK_STATUS(gdp_sample_candidates(g_ctx, &good), GDP_STATUS_INVALID_ARGUMENT);
        CHECK_STATUS(gdp_sample_merge(g_ctx, &mgood), GDP_STATUS_INVALID_ARGUMENT);
    }
    bmem_get(g_ctx, back, rec, (size_t)(n_rows * words) * sizeof *rec);
    CHECK(memcmp(back, sentinel, (size_t)(n_rows * words) * sizeof *back) == 0, "a refused call wrote records");
    bmem_get(g_ctx, back, out, (size_t)n_rows * sizeof *out);
    CHECK(memcmp(back, sentinel, (size_t)n_rows * sizeof *out) == 0, "a refused call wrote outs");
    if (ON_GPU) { /* device rows cannot be checked before the launch: the kernels flag them */
        gdp_sample_out hout[2];
        CHECK_OK(gdp_sample_candidates(g_ctx, &good));
        CHECK_OK(gdp_sample_merge(g_ctx, &mgood));
        bmem_get(g_ctx, hout, out, sizeof hout);
        for (int r = 0; r < 2; r++)
            CHECK(hout[r].flags == GDP_SAMPLE_INVALID_ROW && hout[r].token == 0,
                  "invalid row %d on the GPU: flags %d token %d, want %d, 0", r, hout[r].flags, hout[r].token,
                  GDP_SAMPLE_INVALID_ROW);
    }
    bmem_free(g_ctx, l);
    bmem_free(g_ctx, rows);
    bmem_free(g_ctx, rec);
    bmem_free(g_ctx, out);
    free(sentinel);
    free(back);
}

/* ---- the GPU against the CPU reference ----------------------------------------------- */

#if ON_GPU
static void test_gpu_vs_cpu(test_rng *rng) {
    static const struct {
        int64_t V;
        int32_t max_c, parts;
    } cases[] = {{10007, MAXC, 2}, {10007, 64, 3}, {151936, MAXC, 1}, {262144, MAXC, 1}};
    int64_t sampled = 0, sampled_diff = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        batch b = make_batch(rng, cases[c].V, cases[c].max_c, 5);
        const int64_t n = b.pb.n_rows, words = gdp_sample_record_words(cases[c].max_c);
        const split_t sp = cases[c].parts == 1 ? split_whole(b.pb.V) : split_parts(b.pb.V, cases[c].parts, true, false);
        const size_t rec_n = (size_t)(sp.n * n * words);
        int32_t *rg = malloc(rec_n * sizeof *rg), *rc = malloc(rec_n * sizeof *rc);
        gdp_sample_out *og = malloc((size_t)n * sizeof *og), *oc = malloc((size_t)n * sizeof *oc);
        if (run_sampling(g_ctx, &b.pb, &sp, og, rg) && run_sampling(g_cpu, &b.pb, &sp, oc, rc)) {
            int64_t rec_bad = 0;
            for (int64_t i = 0; i < sp.n * n; i++) {
                const int32_t *g = rg + i * words, *h = rc + i * words;
                bool ok = memcmp(g, h, GDP_SREC_Z * sizeof *g) == 0; /* flags .. n_cand */
                const double zg = gdp_sample_get_f64(g + GDP_SREC_Z), zc = gdp_sample_get_f64(h + GDP_SREC_Z);
                ok = ok && fabs(zg - zc) <= 1e-5 * fabs(zc);
                ok = ok && memcmp(g + GDP_SREC_HEADER, h + GDP_SREC_HEADER, (size_t)(2 * h[GDP_SREC_N_CAND]) * sizeof *g) == 0;
                if (!ok && rec_bad++ < 3)
                    fprintf(stderr, "  record %lld (V %lld): GPU n_cand %d max %d argmax %d, CPU %d %d %d; Z %.9g vs %.9g\n",
                            (long long)i, (long long)b.pb.V, g[GDP_SREC_N_CAND], g[GDP_SREC_MAX], g[GDP_SREC_ARGMAX],
                            h[GDP_SREC_N_CAND], h[GDP_SREC_MAX], h[GDP_SREC_ARGMAX], zg, zc);
            }
            CHECK(rec_bad == 0, "V %lld: %lld GPU records differ from the CPU's", (long long)b.pb.V, (long long)rec_bad);
            for (int64_t r = 0; r < n; r++) {
                CHECK(og[r].flags == oc[r].flags && og[r].margin == oc[r].margin && og[r].scale == oc[r].scale,
                      "row %lld: GPU flags %d margin %g scale %g, CPU %d %g %g", (long long)r, og[r].flags,
                      og[r].margin, og[r].scale, oc[r].flags, oc[r].margin, oc[r].scale);
                if (b.rows[r].temperature == 0.0f || b.rows[r].top_k == 1)
                    CHECK(og[r].token == oc[r].token, "greedy row %lld: GPU token %d, CPU %d", (long long)r,
                          og[r].token, oc[r].token);
                else {
                    sampled++;
                    sampled_diff += og[r].token != oc[r].token;
                }
            }
        }
        free(rg);
        free(rc);
        free(og);
        free(oc);
        free_batch(&b);
    }
    /* The chi-square rows too: 20,000 draws per mode against the CPU. */
    {
        const int64_t N = 20000, V = 40;
        float *one = malloc(V * sizeof *one), *l = malloc((size_t)(N * V) * sizeof *l);
        gdp_sample_row *rows = malloc((size_t)N * sizeof *rows);
        gdp_sample_out *og = malloc((size_t)N * sizeof *og), *oc = malloc((size_t)N * sizeof *oc);
        for (int64_t i = 0; i < V; i++)
            one[i] = (float)(test_normal(rng) * 1.5);
        for (int64_t r = 0; r < N; r++) {
            memcpy(l + r * V, one, V * sizeof *l);
            const opts o = k_modes[1 + r % (N_MODES - 1)];
            rows[r] = mkrow(o.T, o.top_k > 40 ? 40 : o.top_k, o.top_p, (int32_t)r, 77);
        }
        const problem pb = {l, N, V, V, rows, MAXC};
        const split_t sp = split_whole(V);
        if (run_sampling(g_ctx, &pb, &sp, og, NULL) && run_sampling(g_cpu, &pb, &sp, oc, NULL))
            for (int64_t r = 0; r < N; r++) {
                if (rows[r].temperature == 0.0f || rows[r].top_k == 1) {
                    CHECK(og[r].token == oc[r].token, "greedy row %lld: GPU %d CPU %d", (long long)r, og[r].token,
                          oc[r].token);
                } else {
                    sampled++;
                    sampled_diff += og[r].token != oc[r].token;
                }
            }
        free(one);
        free(l);
        free(rows);
        free(og);
        free(oc);
    }
    printf("  GPU vs CPU: %lld of %lld sampled tokens differ (near-ties of the float / double keys)\n",
           (long long)sampled_diff, (long long)sampled);
    CHECK(sampled_diff * 1000 <= sampled, "GPU vs CPU: %lld of %lld sampled tokens differ, more than 1 in 1000",
          (long long)sampled_diff, (long long)sampled);
}

static void graph_replay(const batch *b, const split_t *sp, const gdp_sample_out *eager, gdp_sample_out *replayed) {
    const int64_t n = b->pb.n_rows, V = b->pb.V, words = gdp_sample_record_words(MAXC);
    float *d_l = bmem_alloc(g_ctx, (size_t)(n * V) * sizeof(float));
    gdp_sample_row *d_rows = bmem_alloc(g_ctx, (size_t)n * sizeof *d_rows);
    int32_t *d_rec = bmem_alloc(g_ctx, (size_t)(2 * n * words) * sizeof(int32_t));
    gdp_sample_out *d_out = bmem_alloc(g_ctx, (size_t)n * sizeof *d_out);
    bmem_put(g_ctx, d_l, b->l, (size_t)(n * V) * sizeof(float));
    bmem_put(g_ctx, d_rows, b->rows, (size_t)n * sizeof *d_rows);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CUDA_OK(cudaStreamBeginCapture(g_test_stream, cudaStreamCaptureModeGlobal));
    for (int32_t p = 0; p < sp->n; p++) {
        const gdp_sample_candidates_args a = {.logits = d_l + sp->off[p], .n_rows = n, .vocab_local = sp->len[p],
                                              .ld = V, .vocab_offset = sp->off[p], .rows = d_rows,
                                              .max_candidates = MAXC, .records = d_rec + p * n * words};
        CHECK_OK(gdp_sample_candidates(g_ctx, &a));
    }
    const gdp_sample_merge_args m = {.records = d_rec, .n_parts = sp->n, .n_rows = n, .max_candidates = MAXC,
                                     .rows = d_rows, .out = d_out};
    CHECK_OK(gdp_sample_merge(g_ctx, &m));
    CUDA_OK(cudaStreamEndCapture(g_test_stream, &graph));
    if (graph) {
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 2 && exec; rep++) {
            CUDA_OK(cudaMemset(d_out, 0xA5, (size_t)n * sizeof *d_out));
            CUDA_OK(cudaGraphLaunch(exec, g_test_stream));
            bmem_get(g_ctx, replayed, d_out, (size_t)n * sizeof *replayed);
            CHECK(memcmp(eager, replayed, (size_t)n * sizeof *eager) == 0, "graph replay %d differs from eager", rep);
        }
        if (exec)
            CUDA_OK(cudaGraphExecDestroy(exec));
        CUDA_OK(cudaGraphDestroy(graph));
    }
    bmem_free(g_ctx, d_l);
    bmem_free(g_ctx, d_rows);
    bmem_free(g_ctx, d_rec);
    bmem_free(g_ctx, d_out);
}

/* Both stages captured into a graph and replayed equal the eager run, bitwise. */
static void test_graph(test_rng *rng) {
    batch b = make_batch(rng, 32000, MAXC, 5);
    const int64_t n = b.pb.n_rows;
    const split_t sp = split_parts(b.pb.V, 2, false, false);
    gdp_sample_out *eager = malloc((size_t)n * sizeof *eager), *replayed = malloc((size_t)n * sizeof *replayed);
    if (run_sampling(g_ctx, &b.pb, &sp, eager, NULL))
        graph_replay(&b, &sp, eager, replayed);
    free(eager);
    free(replayed);
    free_batch(&b);
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : (x > y ? 1 : 0);
}

/* Stage 1 + 2 for 256 rows, vocab 32000 and 151936, one slice, per mode: median of 20. */
static void bench(test_rng *rng) {
    static const int64_t vocabs[] = {32000, 151936};
    static const struct {
        const char *name;
        opts o;
    } modes[] = {{"greedy", {0.0f, 0, 1.0f}},
                 {"temperature 1", {1.0f, 0, 1.0f}},
                 {"top-k 50", {1.0f, 50, 1.0f}},
                 {"top-p 0.9", {1.0f, 0, 0.9f}},
                 {"top-k 50 + top-p 0.9", {1.0f, 50, 0.9f}}};
    const int64_t n = 256, words = gdp_sample_record_words(MAXC);
    printf("# sampling, stage 1 + 2, %lld rows, one slice, max_candidates %d (CUDA events, median of 20)\n",
           (long long)n, MAXC);
    printf("# %-22s %10s %10s\n", "mode", "V=32000", "V=151936");
    double us[5][2];
    for (size_t vi = 0; vi < 2; vi++) {
        const int64_t V = vocabs[vi];
        float *hl = malloc((size_t)(n * V) * sizeof *hl);
        for (int64_t i = 0; i < n * V; i++)
            hl[i] = (float)(test_normal(rng) * 3.0);
        float *d_l = bmem_alloc(g_ctx, (size_t)(n * V) * sizeof(float));
        gdp_sample_row *d_rows = bmem_alloc(g_ctx, (size_t)n * sizeof *d_rows);
        int32_t *d_rec = bmem_alloc(g_ctx, (size_t)(n * words) * sizeof(int32_t));
        gdp_sample_out *d_out = bmem_alloc(g_ctx, (size_t)n * sizeof *d_out);
        bmem_put(g_ctx, d_l, hl, (size_t)(n * V) * sizeof(float));
        cudaEvent_t e0, e1;
        CUDA_OK(cudaEventCreate(&e0));
        CUDA_OK(cudaEventCreate(&e1));
        for (size_t m = 0; m < 5; m++) {
            gdp_sample_row hrows[256];
            for (int64_t r = 0; r < n; r++)
                hrows[r] = mkrow(modes[m].o.T, modes[m].o.top_k, modes[m].o.top_p, (int32_t)r, 42);
            bmem_put(g_ctx, d_rows, hrows, sizeof hrows);
            const gdp_sample_candidates_args a = {.logits = d_l, .n_rows = n, .vocab_local = V, .ld = V,
                                                  .vocab_offset = 0, .rows = d_rows, .max_candidates = MAXC,
                                                  .records = d_rec};
            const gdp_sample_merge_args mg = {.records = d_rec, .n_parts = 1, .n_rows = n, .max_candidates = MAXC,
                                              .rows = d_rows, .out = d_out};
            float t[20];
            for (int rep = -3; rep < 20; rep++) {
                CUDA_OK(cudaEventRecord(e0, g_test_stream));
                CHECK_OK(gdp_sample_candidates(g_ctx, &a));
                CHECK_OK(gdp_sample_merge(g_ctx, &mg));
                CUDA_OK(cudaEventRecord(e1, g_test_stream));
                CUDA_OK(cudaEventSynchronize(e1));
                float ms = 0;
                CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
                if (rep >= 0)
                    t[rep] = ms;
            }
            qsort(t, 20, sizeof t[0], cmp_float);
            us[m][vi] = 0.5 * (t[9] + t[10]) * 1000.0;
        }
        CUDA_OK(cudaEventDestroy(e0));
        CUDA_OK(cudaEventDestroy(e1));
        bmem_free(g_ctx, d_l);
        bmem_free(g_ctx, d_rows);
        bmem_free(g_ctx, d_rec);
        bmem_free(g_ctx, d_out);
        free(hl);
    }
    for (size_t m = 0; m < 5; m++)
        printf("  %-22s %10.1f %10.1f\n", modes[m].name, us[m][0], us[m][1]);
}
#endif /* ON_GPU */

int main(int argc, char **argv) {
#ifdef GDP_TEST_SAMPLING_GPU
    const char *name = "test_sampling_gpu";
#else
    const char *name = "test_sampling";
#endif
#if defined(GDP_TEST_SAMPLING_GPU) && !ON_GPU
    printf("%s: skipped: this libgdp was built without the CUDA backend\n", name);
    return TEST_SKIP;
#endif
#if ON_GPU
    if (!test_gpu_present(name))
        return TEST_SKIP;
    if (!test_gpu_job_init()) /* blocking stream: ordered with the plain cudaMemcpy calls */
        return test_finish(name);
    g_ctx = g_test_gpu, g_cpu = g_test_cpu;
#else
    CHECK_OK(gdp_ctx_init(&g_ctx, GDP_BACKEND_CPU, 0));
    g_cpu = g_ctx;
    if (g_ctx == NULL)
        return test_finish(name);
#endif
    test_rng rng;
    test_rng_seed(&rng, 20260611);
#if ON_GPU
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench(&rng);
        test_gpu_job_free();
        return test_finish(name);
    }
#endif
    (void)argc;
    (void)argv;
    test_bad_args();
    test_greedy(&rng);
    test_nonfinite(&rng);
    printf("%s: chi-square goodness of fit, 20000 draws each\n", name);
    test_chi_square(&rng);
    test_split_invariance(&rng);
    test_batch_invariance(&rng);
    test_reproducible(&rng);
#if ON_GPU
    test_gpu_vs_cpu(&rng);
    test_graph(&rng);
    test_gpu_job_free();
#else
    gdp_ctx_free(g_ctx);
#endif
    return test_finish(name);
}
