/*
 * test_chunk_cpu.c: the CPU reference of the chunk family.
 *   1. The chunked algorithm of one (sequence, head) against the per-token recurrence, both
 *      in double: relative error <= 1e-9 on o, the final state and the chunk states over
 *      every (L, M) pair of L in {0,1,63,64,65,128,130,257} x M in {1,2,3,4}, with K in
 *      {32,64,100,128}, varied V, with/without initial state and L2 norm.
 *   2. The public varlen op and the public oracle on packed batches (zero-length sequences
 *      in the middle and at the end, a padded token tail, descriptors given or derived,
 *      fp32/bf16/fp16 inputs): each output against the double recurrence of its sequence
 *      (rounded to the output dtype), chunk state rows against the recurrence stopped after
 *      64c tokens, tail rows exactly 0, rows past chunk_offsets[N] untouched.
 *   3. Cache mode (fp32, bf16 and a slot-strided cache): named slots get the final state,
 *      slots nobody names are byte-identical, -1 requests compute outputs and write nothing.
 *   4. Bad inputs: every rejected argument returns INVALID_ARGUMENT / UNSUPPORTED with a
 *      fresh message and modifies no output byte.
 *   5. gdp_l2norm and gdp_chunk_local_cumsum against direct double formulas.
 *   6. The profile (gdp/profile.h) around a CPU chunk call: its time counts as GDP ops and the
 *      chunk stages stay 0 (the CPU backend has none); the stage names.
 *   7. Exact segments (issue 13 item 2's oracle, src/cpu/chunk_segments.c): the segmented
 *      algorithm (transfer maps, fix-up scan, every segment from its entering state) against the
 *      recurrence and the chunked algorithm within the double bar, segments of 1, 2, 3 and 7
 *      expanded chunks over lengths and M whose tokens straddle chunk and segment boundaries
 *      (the outputs formed where a token's last copy lies); the same cases in the GPU split's
 *      order (segment 0, every later segment's maps with their outputs' parts o^G and O^F, the
 *      fix-up, o = o^G + O^F S_j) against the recurrence; a segment of 0 chunks refused by both.
 */
#include <string.h>

#include "cpu/cpu_ops.h"
#include "gdp/profile.h"
#include "internal.h"
#include "test_common.h"

#define CHUNK GDP_CHUNK_SIZE

/* gdp-math.md 8, bar 2: chunked double math vs the recurrence. */
static const double DOUBLE_BAR = 1e-9;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Unit roundoff of RNE rounding into an output dtype: |round(x) - x| <= u |x|. */
static double unit_roundoff(gdp_dtype_t dtype) {
    switch (dtype) {
    case GDP_DTYPE_BF16: return 0x1.0p-8;
    case GDP_DTYPE_FP16: return 0x1.0p-11;
    default: return 0x1.0p-24;
    }
}

static double to_fp32(double x) { return (double)(float)x; }

/* Decays like the golden files: logsigmoid(u) / normalizer, inside [-20, -1e-4], about a
 * quarter of them exactly 0 (zero-decay tokens). */
static double draw_decay(test_rng *r) {
    static const double normalizers[3] = {0.1, 1.0, 10.0};
    if (test_uniform(r) < 0.25)
        return 0.0;
    double u = 2.0 * test_normal(r);
    double logsig = u < 0 ? u - log1p(exp(u)) : -log1p(exp(-u));
    double g = logsig / normalizers[(int)(test_uniform(r) * 3) % 3];
    if (g < -20.0) g = -20.0;
    if (g > -1e-4) g = -1e-4;
    return g;
}

static void l2norm_row(double *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] * x[i];
    double d = sqrt(s + 1e-6);
    for (int64_t i = 0; i < n; i++) x[i] /= d;
}

static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* Relative error of a vs the reference b, norm-wise and max-wise, against DOUBLE_BAR. */
static void check_double(const char *what, const double *a, const double *b, int64_t n) {
    if (n == 0) return;
    double rel = test_rel_rms(a, b, n);
    double bn = max_abs(b, n), worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]));
    double rel_max = bn > 0 ? worst / bn : worst;
    CHECK(rel <= DOUBLE_BAR && rel_max <= DOUBLE_BAR, "%s: relative RMS %.3e, max %.3e > %.0e (n=%lld)", what, rel,
          rel_max, DOUBLE_BAR, (long long)n);
}

/* o [L, V], the final state [K, V] and nc chunk states of one (sequence, head) run against a reference
 * run's, each within the double bar; `against` ends the messages (" vs chunked", or ""). */
static void check_seq_run(const char *what, const char *against, const double *o, const double *st, const double *h,
                          const double *o_ref, const double *st_ref, const double *h_ref, int64_t L, int64_t K,
                          int64_t V, int64_t nc) {
    char w[400];
    snprintf(w, sizeof w, "%s o%s", what, against);
    check_double(w, o, o_ref, L * V);
    snprintf(w, sizeof w, "%s final state%s", what, against);
    check_double(w, st, st_ref, K * V);
    snprintf(w, sizeof w, "%s chunk states%s", what, against);
    check_double(w, h, h_ref, nc * K * V);
}

/* Output values a (read back from a tensor) vs double reference b: the rounding of the
 * output dtype on top of the double bar: |a - b| <= u |b| + 1e-9 max|b|. */
static void check_rounded(const char *what, const double *a, const double *b, int64_t n, gdp_dtype_t dtype) {
    if (n == 0) return;
    int64_t worst;
    int64_t bad = test_count_bad(a, b, n, DOUBLE_BAR * max_abs(b, n), unit_roundoff(dtype), &worst);
    CHECK(bad == 0, "%s: %lld of %lld elements beyond %s rounding + %.0e; worst [%lld] got %.9g want %.9g", what,
          (long long)bad, (long long)n, gdp_dtype_name(dtype), DOUBLE_BAR, (long long)worst, a[worst], b[worst]);
}

/* ==== 1. chunked vs recurrence, double math, one (sequence, head) ========================= */
typedef struct seq_inputs {
    int64_t L, M, K, V;
    double *q, *k, *v, *beta, *g, *s0;
} seq_inputs;

/* Zeroed rows for one sequence of L tokens and its initial state (the rows with a spare
 * element, so L = 0 still allocates). */
static void seq_inputs_alloc(seq_inputs *s, int64_t L, int64_t M, int64_t K, int64_t V) {
    s->L = L; s->M = M; s->K = K; s->V = V;
    s->q = calloc((size_t)(L * K + 1), sizeof(double));
    s->k = calloc((size_t)(L * M * K + 1), sizeof(double));
    s->v = calloc((size_t)(L * M * V + 1), sizeof(double));
    s->beta = calloc((size_t)(L * M + 1), sizeof(double));
    s->g = calloc((size_t)(L + 1), sizeof(double));
    s->s0 = calloc((size_t)(K * V), sizeof(double));
}

static void seq_inputs_make(seq_inputs *s, test_rng *r, int64_t L, int64_t M, int64_t K, int64_t V, bool l2norm,
                            bool init) {
    seq_inputs_alloc(s, L, M, K, V);
    /* fp32 inputs. Without the L2 norm, keys are kept small (|k|^2 ~ 1/3) so that
     * I - beta k k^T stays a contraction, as normalized keys make it. */
    for (int64_t i = 0; i < L * K; i++) s->q[i] = to_fp32(l2norm ? test_normal(r) : test_uniform_range(r, -1, 1));
    for (int64_t i = 0; i < L * M * K; i++)
        s->k[i] = to_fp32(l2norm ? test_normal(r) : test_uniform_range(r, -1, 1) / sqrt((double)K));
    for (int64_t i = 0; i < L * M * V; i++) s->v[i] = to_fp32(test_uniform_range(r, -1, 1));
    for (int64_t i = 0; i < L * M; i++) s->beta[i] = to_fp32(test_uniform_range(r, 0.01, 0.99));
    for (int64_t i = 0; i < L; i++) s->g[i] = to_fp32(draw_decay(r));
    for (int64_t i = 0; init && i < K * V; i++) s->s0[i] = to_fp32(test_uniform_range(r, -0.5, 0.5));
    if (l2norm) {
        for (int64_t t = 0; t < L; t++) l2norm_row(s->q + t * K, K);
        for (int64_t j = 0; j < L * M; j++) l2norm_row(s->k + j * K, K);
    }
}

static void seq_inputs_free(seq_inputs *s) {
    free(s->q); free(s->k); free(s->v); free(s->beta); free(s->g); free(s->s0);
}

/* Runs `fn` on the first `len` tokens of s; outputs o [len, V], state [K, V], states. */
static gdp_status_t run_seq(gdp_cpu_seq_head_fn fn, const seq_inputs *s, int64_t len, double scale, int exact,
                            double *o, double *state, double *states) {
    memcpy(state, s->s0, (size_t)(s->K * s->V) * sizeof(double));
    gdp_cpu_seq_head p = {
        .len = len, .num_householder = (int32_t)s->M, .key_dim = s->K, .value_dim = s->V, .scale = scale,
        .log2e = exact ? 1.0 / M_LN2 : (double)GDP_RCP_LN2, .exact_log2e = exact,
        .q = s->q, .k = s->k, .v = s->v, .beta = s->beta, .g = s->g, .state = state, .o = o, .chunk_states = states,
    };
    return fn(&p);
}

static void test_double_sweep(void) {
    static const int64_t Ls[8] = {0, 1, 63, 64, 65, 128, 130, 257};
    static const int64_t Ms[4] = {1, 2, 3, 4};
    static const int64_t Ks[4] = {32, 64, 100, 128};
    static const int64_t Vs[4] = {64, 48, 128, 100};
    test_rng r;
    test_rng_seed(&r, 1001);
    int cases = 0;
    for (int li = 0; li < 8; li++) {
        for (int mi = 0; mi < 4; mi++) {
            /* Every (L, M) pair; K, V, initial state and L2 norm rotate so each value meets
             * every M and most L. exact_log2e = 0 on a quarter of the cases: both sides then
             * use RCP_LN2 and must still agree. */
            const int64_t L = Ls[li], M = Ms[mi], K = Ks[(li + mi) % 4], V = Vs[(li + 2 * mi) % 4];
            const bool init = (li + mi) % 2 == 0, l2norm = (li / 2 + mi) % 2 == 0;
            const int exact = (li + 3 * mi) % 4 != 0;
            const double scale = 1.0 / sqrt((double)K);
            seq_inputs s;
            seq_inputs_make(&s, &r, L, M, K, V, l2norm, init);
            const int64_t nc = ceil_div(L, CHUNK);
            double *o_c = calloc((size_t)(L * V + 1), sizeof(double)), *o_n = calloc((size_t)(L * V + 1), sizeof(double));
            double *s_c = calloc((size_t)(K * V), sizeof(double)), *s_n = calloc((size_t)(K * V), sizeof(double));
            double *h_c = calloc((size_t)(nc * K * V + 1), sizeof(double)), *h_n = calloc((size_t)(nc * K * V + 1), sizeof(double));
            CHECK_OK(run_seq(gdp_cpu_chunked_seq_head, &s, L, scale, exact, o_c, s_c, h_c));
            CHECK_OK(run_seq(gdp_cpu_recurrent_seq_head, &s, L, scale, exact, o_n, s_n, h_n));
            char what[160];
            snprintf(what, sizeof what, "L=%lld M=%lld K=%lld V=%lld init=%d l2=%d exact=%d", (long long)L,
                     (long long)M, (long long)K, (long long)V, init, l2norm, exact);
            check_seq_run(what, "", o_c, s_c, h_c, o_n, s_n, h_n, L, K, V, nc);
            char w2[320];
            if (L == 0) /* no token: the state passes through bit for bit */
                CHECK(memcmp(s_c, s.s0, (size_t)(K * V) * sizeof(double)) == 0, "%s: L=0 changed the state", what);
            if (nc > 0) /* chunk 0 enters with the initial state */
                CHECK(memcmp(h_c, s.s0, (size_t)(K * V) * sizeof(double)) == 0, "%s: chunk state 0 != initial", what);
            /* The state entering chunk c is the final state of the first 64c tokens. */
            if (nc > 1) {
                const int64_t c = nc - 1;
                double *o_p = calloc((size_t)(c * CHUNK * V), sizeof(double)), *s_p = calloc((size_t)(K * V), sizeof(double));
                double *h_p = calloc((size_t)(c * K * V), sizeof(double));
                CHECK_OK(run_seq(gdp_cpu_recurrent_seq_head, &s, c * CHUNK, scale, exact, o_p, s_p, h_p));
                snprintf(w2, sizeof w2, "%s chunk state %lld vs stopped recurrence", what, (long long)c);
                check_double(w2, h_c + c * K * V, s_p, K * V);
                free(o_p); free(s_p); free(h_p);
            }
            free(o_c); free(o_n); free(s_c); free(s_n); free(h_c); free(h_n);
            seq_inputs_free(&s);
            cases++;
        }
    }
    printf("double sweep: %d (L, M) cases, chunked vs recurrence within %.0e\n", cases, DOUBLE_BAR);
}

/* ==== 2. the public varlen op and oracle on packed batches ================================= */
typedef gdp_status_t (*chunk_op_fn)(gdp_ctx_t, const gdp_chunk_args *);
static const struct { const char *name; chunk_op_fn fn; } OPS[2] = {
    {"chunked", gdp_chunk_gated_delta_product_varlen},
    {"recurrent_ref", gdp_gated_delta_product_recurrent_ref},
};

typedef struct batch_spec {
    const char *name;
    int         n_seqs;
    int         lens[8];
    int         tail; /* padding tokens past cu_seqlens[N] */
    int         M, H, K, V;
    gdp_dtype_t in_dtype, beta_dtype, init_dtype, o_dtype;
    bool        init, l2norm, descriptors;
    int         exact;
    double      scale; /* 0: the default K^-0.5 */
} batch_spec;

typedef struct batch {
    batch_spec sp;
    int64_t    N, T, n_chunks;
    int64_t    offsets[9]; /* chunk_offsets, computed here from the lengths */
    gdp_tensor q, k, v, g, beta, cu_seqlens, initial_state;
    gdp_tensor chunk_indices, chunk_indices_dp, chunk_offsets;
} batch;

static void batch_make(batch *b, const batch_spec *sp, test_rng *r) {
    memset(b, 0, sizeof *b);
    b->sp = *sp;
    const int64_t N = sp->n_seqs, M = sp->M, H = sp->H, K = sp->K, V = sp->V;
    int64_t total = 0;
    for (int i = 0; i < N; i++) total += sp->lens[i];
    const int64_t T = total + sp->tail;
    b->N = N;
    b->T = T;
    const int64_t q_shape[4] = {1, T, H, K}, k_shape[4] = {1, T * M, H, K}, v_shape[4] = {1, T * M, H, V};
    const int64_t g_shape[3] = {1, T, H}, beta_shape[3] = {1, T * M, H}, cu_shape[1] = {N + 1};
    const int64_t state_shape[4] = {N, H, K, V};
    b->q = test_tensor_alloc(sp->in_dtype, 4, q_shape);
    b->k = test_tensor_alloc(sp->in_dtype, 4, k_shape);
    b->v = test_tensor_alloc(sp->in_dtype, 4, v_shape);
    b->g = test_tensor_alloc(GDP_DTYPE_FP32, 3, g_shape);
    b->beta = test_tensor_alloc(sp->beta_dtype, 3, beta_shape);
    b->cu_seqlens = test_tensor_alloc(GDP_DTYPE_INT32, 1, cu_shape);
    int32_t *cu = b->cu_seqlens.data;
    b->offsets[0] = 0;
    for (int64_t i = 0; i < N; i++) {
        cu[i + 1] = cu[i] + sp->lens[i];
        b->offsets[i + 1] = b->offsets[i] + ceil_div(sp->lens[i], CHUNK);
    }
    b->n_chunks = b->offsets[N];
    for (int64_t i = 0; i < T * H * K; i++)
        gdp_tensor_set(&b->q, i, sp->l2norm ? test_normal(r) : test_uniform_range(r, -1, 1));
    for (int64_t i = 0; i < T * M * H * K; i++)
        gdp_tensor_set(&b->k, i, sp->l2norm ? test_normal(r) : test_uniform_range(r, -1, 1) / sqrt((double)K));
    test_fill_uniform(&b->v, r, -1, 1);
    test_fill_uniform(&b->beta, r, 0.01, 0.99);
    for (int64_t i = 0; i < T * H; i++) gdp_tensor_set(&b->g, i, draw_decay(r));
    if (sp->init) {
        b->initial_state = test_tensor_alloc(sp->init_dtype, 4, state_shape);
        test_fill_uniform(&b->initial_state, r, -0.5, 0.5);
    }
    if (sp->descriptors) {
        int64_t rows, rows_dp;
        CHECK_OK(gdp_max_chunk_counts(T, N, (int32_t)M, &rows, &rows_dp));
        const int64_t ci_shape[2] = {rows, 2}, cidp_shape[2] = {rows_dp, 2}, co_shape[1] = {N + 1};
        b->chunk_indices = test_tensor_alloc(GDP_DTYPE_INT32, 2, ci_shape);
        b->chunk_indices_dp = test_tensor_alloc(GDP_DTYPE_INT32, 2, cidp_shape);
        b->chunk_offsets = test_tensor_alloc(GDP_DTYPE_INT32, 1, co_shape);
        CHECK_OK(gdp_build_chunk_descriptors(cu, (int32_t)N, (int32_t)M, T, b->chunk_indices.data,
                                             b->chunk_indices_dp.data, b->chunk_offsets.data, &rows, &rows_dp));
    }
}

static void batch_free(batch *b) {
    free(b->q.data); free(b->k.data); free(b->v.data); free(b->g.data); free(b->beta.data);
    free(b->cu_seqlens.data); free(b->initial_state.data);
    free(b->chunk_indices.data); free(b->chunk_indices_dp.data); free(b->chunk_offsets.data);
}

static gdp_chunk_args batch_args(const batch *b) {
    gdp_chunk_args a = {
        .q = b->q, .k = b->k, .v = b->v, .g = b->g, .beta = b->beta, .num_householder = b->sp.M,
        .cu_seqlens = b->cu_seqlens, .scale = b->sp.scale, .initial_state = b->initial_state,
        .use_qk_l2norm_in_kernel = b->sp.l2norm, .chunk_indices = b->chunk_indices,
        .chunk_indices_dp = b->chunk_indices_dp, .chunk_offsets = b->chunk_offsets, .exact_log2e = b->sp.exact,
    };
    return a;
}

/* Sequence i, head h of the batch as double rows (what the op reads), L2-normalized here. */
static void seq_inputs_gather(seq_inputs *s, const batch *b, int64_t i, int64_t h) {
    const int32_t *cu = b->cu_seqlens.data;
    const int64_t bos = cu[i], L = cu[i + 1] - cu[i], M = b->sp.M, H = b->sp.H, K = b->sp.K, V = b->sp.V;
    seq_inputs_alloc(s, L, M, K, V);
    for (int64_t t = 0; t < L; t++) {
        for (int64_t c = 0; c < K; c++) s->q[t * K + c] = gdp_tensor_get(&b->q, ((bos + t) * H + h) * K + c);
        s->g[t] = gdp_tensor_get(&b->g, (bos + t) * H + h);
    }
    for (int64_t j = 0; j < L * M; j++) {
        const int64_t row = bos * M + j;
        for (int64_t c = 0; c < K; c++) s->k[j * K + c] = gdp_tensor_get(&b->k, (row * H + h) * K + c);
        for (int64_t c = 0; c < V; c++) s->v[j * V + c] = gdp_tensor_get(&b->v, (row * H + h) * V + c);
        s->beta[j] = gdp_tensor_get(&b->beta, row * H + h);
    }
    if (b->sp.l2norm) {
        for (int64_t t = 0; t < L; t++) l2norm_row(s->q + t * K, K);
        for (int64_t j = 0; j < L * M; j++) l2norm_row(s->k + j * K, K);
    }
    if (b->sp.init)
        for (int64_t c = 0; c < K * V; c++) s->s0[c] = gdp_tensor_get(&b->initial_state, (i * H + h) * K * V + c);
}

/* The double recurrence of every (sequence, head): o [T, H, V] (0 past the end), final
 * states [N, H, K, V] and chunk state rows [n_chunks, H, K, V], each row chunk_offsets[i] + c
 * taken from a recurrence stopped after the first 64c tokens. */
typedef struct batch_ref {
    double *o, *final, *states;
} batch_ref;

static void batch_reference(const batch *b, batch_ref *ref) {
    const int64_t H = b->sp.H, K = b->sp.K, V = b->sp.V, KV = K * V;
    const double scale = b->sp.scale != 0 ? b->sp.scale : 1.0 / sqrt((double)K);
    const int32_t *cu = b->cu_seqlens.data;
    ref->o = calloc((size_t)(b->T * H * V + 1), sizeof(double));
    ref->final = calloc((size_t)(b->N * H * KV + 1), sizeof(double));
    ref->states = calloc((size_t)(b->n_chunks * H * KV + 1), sizeof(double));
    for (int64_t i = 0; i < b->N; i++) {
        for (int64_t h = 0; h < H; h++) {
            seq_inputs s;
            seq_inputs_gather(&s, b, i, h);
            const int64_t L = s.L, nc = ceil_div(L, CHUNK);
            double *o = calloc((size_t)(L * V + 1), sizeof(double)), *st = calloc((size_t)KV, sizeof(double));
            double *scratch = calloc((size_t)(nc * KV + 1), sizeof(double));
            CHECK_OK(run_seq(gdp_cpu_recurrent_seq_head, &s, L, scale, b->sp.exact, o, st, scratch));
            for (int64_t t = 0; t < L; t++)
                memcpy(ref->o + ((cu[i] + t) * H + h) * V, o + t * V, (size_t)V * sizeof(double));
            memcpy(ref->final + (i * H + h) * KV, st, (size_t)KV * sizeof(double));
            for (int64_t c = 0; c < nc; c++) {
                CHECK_OK(run_seq(gdp_cpu_recurrent_seq_head, &s, c * CHUNK, scale, b->sp.exact, o, st, scratch));
                memcpy(ref->states + ((b->offsets[i] + c) * H + h) * KV, st, (size_t)KV * sizeof(double));
            }
            free(o); free(st); free(scratch);
            seq_inputs_free(&s);
        }
    }
}

static void batch_ref_free(batch_ref *ref) { free(ref->o); free(ref->final); free(ref->states); }

static bool bytes_equal_to(const void *p, size_t n, unsigned char value) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != value) return false;
    return true;
}

/* Checks o against the reference: real rows within rounding, tail rows exactly 0. */
static void check_o(const char *what, const gdp_tensor *o, const batch *b, const batch_ref *ref) {
    const int64_t H = b->sp.H, V = b->sp.V, end = ((const int32_t *)b->cu_seqlens.data)[b->N];
    double *got = test_tensor_f64(o);
    char w[200];
    snprintf(w, sizeof w, "%s o", what);
    check_rounded(w, got, ref->o, end * H * V, o->dtype);
    const size_t row_bytes = (size_t)(H * V) * gdp_dtype_size(o->dtype);
    CHECK(bytes_equal_to((char *)o->data + (size_t)end * row_bytes, (size_t)(b->T - end) * row_bytes, 0),
          "%s: the %lld padding tail rows of o are not exactly 0", what, (long long)(b->T - end));
    free(got);
}

/* Checks chunk_states rows < n_chunks against the reference and the rest untouched (0x7f). */
static void check_chunk_states(const char *what, const gdp_tensor *cs, const batch *b, const batch_ref *ref) {
    const int64_t row = b->sp.H * b->sp.K * b->sp.V;
    double *got = test_tensor_f64(cs);
    char w[200];
    snprintf(w, sizeof w, "%s chunk states", what);
    check_rounded(w, got, ref->states, b->n_chunks * row, cs->dtype);
    const size_t row_bytes = (size_t)row * gdp_dtype_size(cs->dtype);
    CHECK(bytes_equal_to((char *)cs->data + (size_t)b->n_chunks * row_bytes,
                         (size_t)(cs->shape[0] - b->n_chunks) * row_bytes, 0x7f),
          "%s: chunk_states rows past chunk_offsets[N] = %lld were written", what, (long long)b->n_chunks);
    free(got);
}

static void test_batches(gdp_ctx_t ctx) {
    static const batch_spec specs[] = {
        {"M=3 K=100 V=64, zero-length middle and end, tail, descriptors, init, l2norm", 6, {65, 0, 130, 1, 0, 0}, 37,
         3, 2, 100, 64, GDP_DTYPE_FP32, GDP_DTYPE_FP32, GDP_DTYPE_FP32, GDP_DTYPE_FP32, true, true, true, 1, 0.0},
        {"M=2 K=64 V=32, derived descriptors, no init, no l2norm, RCP_LN2, scale 0.3", 3, {63, 64, 128}, 0, 2, 1, 64,
         32, GDP_DTYPE_FP32, GDP_DTYPE_FP32, GDP_DTYPE_FP32, GDP_DTYPE_FP32, false, false, false, 0, 0.3},
        {"M=4 K=32 V=48, bf16 inputs, fp16 initial state, bf16 o", 3, {257, 1, 0}, 5, 4, 2, 32, 48, GDP_DTYPE_BF16,
         GDP_DTYPE_BF16, GDP_DTYPE_FP16, GDP_DTYPE_BF16, true, true, true, 1, 0.0},
        {"M=1 K=128 V=128, fp16 inputs, bf16 initial state", 2, {130, 64}, 1, 1, 2, 128, 128, GDP_DTYPE_FP16,
         GDP_DTYPE_FP32, GDP_DTYPE_BF16, GDP_DTYPE_FP32, true, true, true, 1, 0.0},
        {"no sequence, padding tokens only", 0, {0}, 10, 2, 1, 32, 16, GDP_DTYPE_FP32, GDP_DTYPE_FP32,
         GDP_DTYPE_FP32, GDP_DTYPE_FP32, true, false, true, 1, 0.0},
    };
    test_rng r;
    test_rng_seed(&r, 2002);
    for (size_t c = 0; c < sizeof specs / sizeof specs[0]; c++) {
        batch b;
        batch_make(&b, &specs[c], &r);
        batch_ref ref;
        batch_reference(&b, &ref);
        const int64_t H = b.sp.H, K = b.sp.K, V = b.sp.V;
        for (int op = 0; op < 2; op++) {
            const int64_t o_shape[4] = {1, b.T, H, V}, fs_shape[4] = {b.N, H, K, V};
            const int64_t cs_shape[4] = {b.n_chunks + 3, H, K, V}; /* 3 rows past chunk_offsets[N] */
            gdp_tensor o = test_tensor_alloc(b.sp.o_dtype, 4, o_shape);
            gdp_tensor fs = test_tensor_alloc(GDP_DTYPE_FP32, 4, fs_shape);
            gdp_tensor cs = test_tensor_alloc(GDP_DTYPE_FP32, 4, cs_shape);
            memset(o.data, 0xff, test_tensor_bytes(&o)); /* NaN: "exactly 0" must be written */
            memset(fs.data, 0xff, test_tensor_bytes(&fs));
            memset(cs.data, 0x7f, test_tensor_bytes(&cs));
            gdp_chunk_args a = batch_args(&b);
            a.o = o;
            a.final_state = fs;
            a.output_final_state = 1;
            a.chunk_states = cs;
            a.return_chunk_states = 1;
            CHECK_OK(OPS[op].fn(ctx, &a));
            char what[256];
            snprintf(what, sizeof what, "%s [%s]", specs[c].name, OPS[op].name);
            check_o(what, &o, &b, &ref);
            double *got = test_tensor_f64(&fs);
            char w[300];
            snprintf(w, sizeof w, "%s final state", what);
            check_rounded(w, got, ref.final, b.N * H * K * V, GDP_DTYPE_FP32);
            free(got);
            check_chunk_states(what, &cs, &b, &ref);
            free(o.data); free(fs.data); free(cs.data);
        }
        printf("batch \"%s\": chunked and recurrent_ref match the double recurrence\n", specs[c].name);
        batch_ref_free(&ref);
        batch_free(&b);
    }
}

/* ==== 3. cache mode ============================================================================ */
static void test_cache_mode(gdp_ctx_t ctx) {
    static const batch_spec sp = {"cache", 6, {70, 40, 0, 65, 0, 0}, 11, 2, 2, 64, 32, GDP_DTYPE_FP32,
                                  GDP_DTYPE_FP32, GDP_DTYPE_FP32, GDP_DTYPE_FP32, true, true, true, 1, 0.0};
    /* Request 1 is -1 with 40 tokens (computes outputs, stores nothing); request 2 has 0
     * tokens and slot 2 (it stores its initial state, as upstream); 4 and 5 are padding. */
    static const int32_t slots_of[6] = {5, -1, 2, 0, -1, -1};
    const int64_t n_slots = 7;
    test_rng r;
    test_rng_seed(&r, 3003);
    batch b;
    batch_make(&b, &sp, &r);
    batch_ref ref;
    batch_reference(&b, &ref);
    const int64_t H = sp.H, K = sp.K, V = sp.V, HKV = H * K * V;
    const int64_t si_shape[1] = {b.N};
    gdp_tensor state_indices = test_tensor_alloc(GDP_DTYPE_INT32, 1, si_shape);
    memcpy(state_indices.data, slots_of, sizeof slots_of);

    static const struct { const char *name; gdp_dtype_t dtype; int64_t slot_gap; } variants[3] = {
        {"fp32 cache", GDP_DTYPE_FP32, 0}, {"bf16 cache", GDP_DTYPE_BF16, 0}, {"fp32 slot-strided cache", GDP_DTYPE_FP32, 13},
    };
    for (int var = 0; var < 3; var++) {
        for (int op = 0; op < 2; op++) {
            /* The cache: slots of H*K*V elements, slot_gap elements apart (a strided view). */
            const int64_t slot_stride = HKV + variants[var].slot_gap, n_elems = n_slots * slot_stride;
            const size_t esize = gdp_dtype_size(variants[var].dtype);
            unsigned char *cache = malloc((size_t)n_elems * esize), *before = malloc((size_t)n_elems * esize);
            for (int64_t e = 0; e < n_elems; e++) /* random finite values everywhere, gaps included */
                gdp_store_elem(cache, variants[var].dtype, e, test_uniform_range(&r, -3, 3));
            memcpy(before, cache, (size_t)n_elems * esize);
            const int64_t cache_shape[4] = {n_slots, H, K, V};
            gdp_tensor state;
            gdp_tensor_init(&state, cache, variants[var].dtype, 4, cache_shape);
            if (variants[var].slot_gap) {
                state.stride[0] = slot_stride; state.stride[1] = K * V; state.stride[2] = V; state.stride[3] = 1;
            }

            const int64_t o_shape[4] = {1, b.T, H, V}, fs_shape[4] = {b.N, H, K, V}, cs_shape[4] = {b.n_chunks + 2, H, K, V};
            gdp_tensor o = test_tensor_alloc(GDP_DTYPE_FP32, 4, o_shape);
            gdp_tensor fs = test_tensor_alloc(GDP_DTYPE_FP32, 4, fs_shape);
            gdp_tensor cs = test_tensor_alloc(GDP_DTYPE_FP32, 4, cs_shape);
            memset(o.data, 0xff, test_tensor_bytes(&o));
            memset(fs.data, 0xff, test_tensor_bytes(&fs));
            memset(cs.data, 0x7f, test_tensor_bytes(&cs));
            gdp_chunk_args a = batch_args(&b);
            a.state = state;
            a.state_indices = state_indices;
            a.o = o;
            a.chunk_states = cs;
            a.return_chunk_states = 1;
            char what[200];
            snprintf(what, sizeof what, "cache mode, %s [%s]", variants[var].name, OPS[op].name);
            /* output_final_state beside the cache is refused (final_state used to be left
             * unwritten silently), as the recurrent op refuses it; nothing is written. */
            for (int mix = 0; mix < 2; mix++) {
                a.final_state = mix == 0 ? fs : (gdp_tensor){0};
                a.output_final_state = 1;
                CHECK_STATUS(OPS[op].fn(ctx, &a), GDP_STATUS_INVALID_ARGUMENT);
                CHECK(strstr(gdp_last_error(), "cache mode") && strstr(gdp_last_error(), "output_final_state"),
                      "%s: the mix message: %s", what, gdp_last_error());
                CHECK(memcmp(cache, before, (size_t)n_elems * esize) == 0 &&
                          bytes_equal_to(o.data, test_tensor_bytes(&o), 0xff),
                      "%s: a refused call wrote the cache or o", what);
            }
            a.final_state = fs; /* given but not asked for: ignored, as in dense mode */
            a.output_final_state = 0;
            CHECK_OK(OPS[op].fn(ctx, &a));

            /* Named slots hold the final state of their request, rounded to the cache dtype. */
            bool *written = calloc((size_t)n_elems, sizeof(bool));
            for (int64_t i = 0; i < b.N; i++) {
                if (slots_of[i] < 0) continue;
                double *got = malloc((size_t)HKV * sizeof(double));
                gdp_tensor_read_f64(&state, slots_of[i] * HKV, HKV, got);
                char w[300];
                snprintf(w, sizeof w, "%s slot %d (request %lld)", what, slots_of[i], (long long)i);
                check_rounded(w, got, ref.final + i * HKV, HKV, variants[var].dtype);
                for (int64_t e = 0; e < HKV; e++) written[slots_of[i] * slot_stride + e] = true;
                free(got);
            }
            /* Every other byte (unnamed slots, -1 requests, the gaps) is byte-identical. */
            int64_t changed = 0;
            for (int64_t e = 0; e < n_elems; e++)
                if (!written[e] && memcmp(cache + e * esize, before + e * esize, esize) != 0) changed++;
            CHECK(changed == 0, "%s: %lld cache elements outside the named slots changed", what, (long long)changed);
            CHECK(bytes_equal_to(fs.data, test_tensor_bytes(&fs), 0xff), "%s: final_state was written in cache mode",
                  what);
            check_o(what, &o, &b, &ref); /* includes request 1 (-1, 40 tokens) */
            check_chunk_states(what, &cs, &b, &ref);
            free(written); free(cache); free(before); free(o.data); free(fs.data); free(cs.data);
        }
    }
    printf("cache mode: named slots written, others byte-identical (fp32, bf16, slot-strided)\n");
    free(state_indices.data);
    batch_ref_free(&ref);
    batch_free(&b);
}

/* ==== 4. bad inputs: rejected with a message, nothing modified ================================ */
typedef struct bad_case {
    gdp_chunk_args a;
    int32_t        cu[3], ci[64], cidp[64], co[3], si[2]; /* mutable copies of the index arrays */
} bad_case;

enum { BAD_SEQS = 2, BAD_SLOTS = 3 };

/* Runs one rejected call through both ops: expects `expect`, a fresh message naming the op,
 * and every output byte (o, final_state, chunk_states, the cache) unchanged. */
static void expect_rejected(gdp_ctx_t ctx, const char *what, const gdp_chunk_args *a, gdp_status_t expect,
                            gdp_tensor *const *outs, const unsigned char *const *snap, int n_outs) {
    for (int op = 0; op < 2; op++) {
        gdp_set_error(GDP_STATUS_SUCCESS, __FILE__, __LINE__, "stale sentinel");
        gdp_status_t st = OPS[op].fn(ctx, a);
        const char *msg = gdp_last_error();
        CHECK(st == expect, "%s [%s]: status %d (%s), expected %d; message: %s", what, OPS[op].name, (int)st,
              gdp_status_string(st), (int)expect, msg);
        CHECK(strstr(msg, "stale sentinel") == NULL && strstr(msg, "gdp_") != NULL,
              "%s [%s]: no fresh error message (got \"%s\")", what, OPS[op].name, msg);
        for (int i = 0; i < n_outs; i++)
            CHECK(memcmp(outs[i]->data, snap[i], test_tensor_bytes(outs[i])) == 0, "%s [%s]: output %d was modified",
                  what, OPS[op].name, i);
    }
}

static void test_bad_inputs(gdp_ctx_t ctx) {
    static const batch_spec sp = {"bad", BAD_SEQS, {70, 10}, 60, 2, 2, 32, 16, GDP_DTYPE_FP32, GDP_DTYPE_FP32,
                                  GDP_DTYPE_FP32, GDP_DTYPE_FP32, true, true, true, 1, 0.0};
    test_rng r;
    test_rng_seed(&r, 4004);
    batch b;
    batch_make(&b, &sp, &r);
    const int64_t H = sp.H, K = sp.K, V = sp.V;
    const int64_t o_shape[4] = {1, b.T, H, V}, fs_shape[4] = {b.N, H, K, V}, cs_shape[4] = {b.n_chunks, H, K, V};
    const int64_t st_shape[4] = {BAD_SLOTS, H, K, V}, si_shape[1] = {b.N};
    gdp_tensor o = test_tensor_alloc(GDP_DTYPE_FP32, 4, o_shape);
    gdp_tensor fs = test_tensor_alloc(GDP_DTYPE_FP32, 4, fs_shape);
    gdp_tensor cs = test_tensor_alloc(GDP_DTYPE_FP32, 4, cs_shape);
    gdp_tensor state = test_tensor_alloc(GDP_DTYPE_FP32, 4, st_shape);
    gdp_tensor si = test_tensor_alloc(GDP_DTYPE_INT32, 1, si_shape);
    ((int32_t *)si.data)[0] = 2;
    ((int32_t *)si.data)[1] = 0;
    memset(o.data, 0xab, test_tensor_bytes(&o));
    memset(fs.data, 0xcd, test_tensor_bytes(&fs));
    memset(cs.data, 0x7f, test_tensor_bytes(&cs));
    test_fill_uniform(&state, &r, -1, 1);
    gdp_tensor *outs[4] = {&o, &fs, &cs, &state};
    unsigned char *snap[4];
    for (int i = 0; i < 4; i++) {
        snap[i] = malloc(test_tensor_bytes(outs[i]));
        memcpy(snap[i], outs[i]->data, test_tensor_bytes(outs[i]));
    }

    /* The valid call every case below mutates: cache mode, chunk states, dense final_state
     * tensor present too. Index arrays point at the case's own copies. */
    bad_case base;
    memset(&base, 0, sizeof base);
    base.a = batch_args(&b);
    base.a.o = o;
    base.a.final_state = fs;
    base.a.chunk_states = cs;
    base.a.return_chunk_states = 1;
    base.a.state = state;
    base.a.state_indices = si;
    CHECK(b.chunk_indices.shape[0] <= 32 && b.chunk_indices_dp.shape[0] <= 32, "descriptor copies too small");
    memcpy(base.cu, b.cu_seqlens.data, sizeof base.cu);
    memcpy(base.ci, b.chunk_indices.data, (size_t)b.chunk_indices.shape[0] * 2 * sizeof(int32_t));
    memcpy(base.cidp, b.chunk_indices_dp.data, (size_t)b.chunk_indices_dp.shape[0] * 2 * sizeof(int32_t));
    memcpy(base.co, b.chunk_offsets.data, sizeof base.co);
    memcpy(base.si, si.data, sizeof base.si);
    const int64_t real_dp = ceil_div(70 * 2, CHUNK) + ceil_div(10 * 2, CHUNK);
    const int32_t T = (int32_t)b.T;

    int n_cases = 0;
#define BAD_CASE(desc, expect, mutation)                                                              \
    do {                                                                                              \
        bad_case c_ = base;                                                                           \
        gdp_chunk_args *a = &c_.a;                                                                    \
        a->cu_seqlens.data = c_.cu; a->chunk_indices.data = c_.ci; a->chunk_indices_dp.data = c_.cidp; \
        a->chunk_offsets.data = c_.co; a->state_indices.data = c_.si;                                 \
        mutation;                                                                                     \
        expect_rejected(ctx, desc, a, expect, outs, (const unsigned char *const *)snap, 4);           \
        n_cases++;                                                                                    \
    } while (0)

    const gdp_status_t INV = GDP_STATUS_INVALID_ARGUMENT, UNS = GDP_STATUS_UNSUPPORTED;
    /* shapes */
    BAD_CASE("q with 3 dims", INV, a->q.ndim = 3);
    BAD_CASE("q batch 2", INV, a->q.shape[0] = 2);
    BAD_CASE("k rows != T*M", INV, a->k.shape[1] -= 1);
    BAD_CASE("k key dim != q's", INV, a->k.shape[3] = K / 2);
    BAD_CASE("v heads != H", INV, a->v.shape[2] = H + 1);
    BAD_CASE("g tokens != T", INV, a->g.shape[1] = T + 1);
    BAD_CASE("beta rows != T*M", INV, a->beta.shape[1] = T);
    BAD_CASE("o tokens != T", INV, a->o.shape[1] = T - 1);
    BAD_CASE("o value dim != V", INV, a->o.shape[3] = V + 1);
    BAD_CASE("initial_state N wrong", INV, a->initial_state.shape[0] = 1);
    BAD_CASE("chunk_states heads wrong", INV, a->chunk_states.shape[1] = 1);
    BAD_CASE("state key dim wrong", INV, a->state.shape[2] = K + 1);
    BAD_CASE("state_indices length wrong", INV, a->state_indices.shape[0] = 1);
    BAD_CASE("cu_seqlens 2-D", INV, a->cu_seqlens.ndim = 2);
    BAD_CASE("chunk_offsets length wrong", INV, a->chunk_offsets.shape[0] = BAD_SEQS);
    BAD_CASE("chunk_indices not pairs", INV, a->chunk_indices.shape[1] = 3);
    BAD_CASE("final_state N wrong (dense)", INV, (a->state.data = NULL, a->state_indices.data = NULL,
                                                  a->output_final_state = 1, a->final_state.shape[0] = 3));
    /* dtypes */
    BAD_CASE("k bf16 while q is fp32", INV, a->k.dtype = GDP_DTYPE_BF16);
    BAD_CASE("v fp16 while q is fp32", INV, a->v.dtype = GDP_DTYPE_FP16);
    BAD_CASE("q int32", INV, a->q.dtype = GDP_DTYPE_INT32);
    BAD_CASE("g int32", INV, a->g.dtype = GDP_DTYPE_INT32);
    BAD_CASE("beta int32", INV, a->beta.dtype = GDP_DTYPE_INT32);
    BAD_CASE("o int32", INV, a->o.dtype = GDP_DTYPE_INT32);
    BAD_CASE("cu_seqlens fp32", INV, a->cu_seqlens.dtype = GDP_DTYPE_FP32);
    BAD_CASE("chunk_indices fp32", INV, a->chunk_indices.dtype = GDP_DTYPE_FP32);
    BAD_CASE("state_indices fp32", INV, a->state_indices.dtype = GDP_DTYPE_FP32);
    BAD_CASE("state fp16 (cache is fp32 or bf16)", INV, a->state.dtype = GDP_DTYPE_FP16);
    BAD_CASE("initial_state int32", INV, a->initial_state.dtype = GDP_DTYPE_INT32);
    BAD_CASE("dense final_state bf16", INV, (a->state.data = NULL, a->state_indices.data = NULL,
                                             a->output_final_state = 1, a->final_state.dtype = GDP_DTYPE_BF16));
    BAD_CASE("invalid dtype value", INV, a->v.dtype = (gdp_dtype_t)77);
    /* sizes */
    BAD_CASE("K = 257 > 256", UNS, (a->q.shape[3] = 257, a->k.shape[3] = 257));
    BAD_CASE("V = 257 > 256", UNS, a->v.shape[3] = 257);
    BAD_CASE("num_householder 0", INV, a->num_householder = 0);
    BAD_CASE("scale NaN", INV, a->scale = NAN);
    BAD_CASE("scale inf", INV, a->scale = INFINITY);
    BAD_CASE("max_seqlen negative", INV, a->max_seqlen = -1);
    BAD_CASE("max_seqlen > T", INV, a->max_seqlen = T + 1);
    /* cu_seqlens contents */
    BAD_CASE("decreasing cu_seqlens", INV, (c_.cu[1] = 75, c_.cu[2] = 74));
    BAD_CASE("cu_seqlens[0] != 0", INV, c_.cu[0] = 1);
    BAD_CASE("cu_seqlens[N] > T", INV, c_.cu[2] = T + 1);
    /* descriptors */
    BAD_CASE("only two descriptors", INV, a->chunk_offsets.data = NULL);
    BAD_CASE("only chunk_indices", INV, (a->chunk_offsets.data = NULL, a->chunk_indices_dp.data = NULL));
    BAD_CASE("chunk_offsets[1] wrong", INV, c_.co[1] = 1);
    BAD_CASE("chunk_offsets[0] != 0", INV, c_.co[0] = 1);
    BAD_CASE("chunk_indices real row wrong", INV, c_.ci[2 * 1 + 1] = 0);
    BAD_CASE("chunk_indices rows swapped", INV, (c_.ci[2 * 2] = 0, c_.ci[2 * 2 + 1] = 1, c_.ci[2] = 1, c_.ci[3] = 0));
    BAD_CASE("chunk_indices_dp real row wrong", INV, c_.cidp[2 * (real_dp - 1)] = 0);
    BAD_CASE("chunk_indices padding row addresses data", INV, (c_.ci[2 * 3] = 0, c_.ci[2 * 3 + 1] = 1));
    BAD_CASE("chunk_indices_dp padding row names no sequence", INV, c_.cidp[2 * real_dp] = BAD_SEQS);
    BAD_CASE("chunk_indices fewer rows than chunks", INV, a->chunk_indices.shape[0] = 2);
    BAD_CASE("chunk_indices_dp fewer rows than chunks", INV, a->chunk_indices_dp.shape[0] = real_dp - 1);
    /* cache mode */
    BAD_CASE("state_indices without state", INV, a->state.data = NULL);
    BAD_CASE("state without state_indices", INV, a->state_indices.data = NULL);
    BAD_CASE("cache mode without descriptors", INV,
             (a->chunk_indices.data = NULL, a->chunk_indices_dp.data = NULL, a->chunk_offsets.data = NULL));
    BAD_CASE("slot index == slots", INV, c_.si[1] = BAD_SLOTS);
    BAD_CASE("slot index -2", INV, c_.si[0] = -2);
    BAD_CASE("two requests name one slot", INV, c_.si[1] = 2);
    BAD_CASE("cache with non-contiguous [K, V]", INV,
             (a->state.stride[0] = H * K * V, a->state.stride[1] = K * V, a->state.stride[2] = 1, a->state.stride[3] = K));
    /* outputs */
    BAD_CASE("chunk_states fewer rows than chunks", INV, a->chunk_states.shape[0] = b.n_chunks - 1);
    BAD_CASE("return_chunk_states without chunk_states", INV, a->chunk_states.data = NULL);
    BAD_CASE("output_final_state without final_state (dense)", INV,
             (a->state.data = NULL, a->state_indices.data = NULL, a->output_final_state = 1, a->final_state.data = NULL));
    BAD_CASE("o absent", INV, a->o.data = NULL);
    BAD_CASE("q strided", INV, (a->q.stride[0] = 1, a->q.stride[1] = 2 * H * K, a->q.stride[2] = K, a->q.stride[3] = 1));
#undef BAD_CASE
    /* NULL args and ctx */
    expect_rejected(ctx, "args NULL", NULL, INV, outs, (const unsigned char *const *)snap, 4);
    {
        gdp_chunk_args a = base.a;
        for (int op = 0; op < 2; op++)
            CHECK_STATUS(OPS[op].fn(NULL, &a), INV);
    }

    /* The unmutated call is valid for both ops (so each case above failed for its mutation). */
    for (int op = 0; op < 2; op++) {
        gdp_chunk_args a = base.a;
        CHECK_OK(OPS[op].fn(ctx, &a));
    }
    printf("bad inputs: %d rejected cases x 2 ops, nothing modified\n", n_cases + 1);
    for (int i = 0; i < 4; i++) free(snap[i]);
    free(o.data); free(fs.data); free(cs.data); free(state.data); free(si.data);
    batch_free(&b);
}

/* ==== 5. gdp_l2norm and gdp_chunk_local_cumsum ================================================ */
static void test_l2norm(gdp_ctx_t ctx) {
    const int64_t K = 100, shape[3] = {2, 3, K}, rows = 6;
    test_rng r;
    test_rng_seed(&r, 5005);
    gdp_tensor x = test_tensor_alloc(GDP_DTYPE_FP32, 3, shape);
    for (int64_t i = 0; i < rows * K; i++) gdp_tensor_set(&x, i, 3.0 * test_normal(&r));
    for (int64_t c = 0; c < K; c++) gdp_tensor_set(&x, 4 * K + c, 0.0); /* an all-zero row stays 0 */
    double *want = test_tensor_f64(&x);
    for (int64_t row = 0; row < rows; row++) l2norm_row(want + row * K, K);

    static const gdp_dtype_t out_dtypes[3] = {GDP_DTYPE_FP32, GDP_DTYPE_BF16, GDP_DTYPE_FP16};
    for (int d = 0; d < 3; d++) {
        gdp_tensor y = test_tensor_alloc(out_dtypes[d], 3, shape);
        memset(y.data, 0xff, test_tensor_bytes(&y));
        CHECK_OK(gdp_l2norm(ctx, &y, &x));
        double *got = test_tensor_f64(&y);
        int64_t worst;
        /* fp16 has subnormals below 2^-14: there the rounding error is absolute, <= 2^-25. */
        const double atol = out_dtypes[d] == GDP_DTYPE_FP16 ? 0x1.0p-25 : 0.0;
        int64_t bad = test_count_bad(got, want, rows * K, atol, unit_roundoff(out_dtypes[d]), &worst);
        CHECK(bad == 0, "l2norm fp32 -> %s: %lld elements beyond rounding; worst [%lld] %.9g vs %.9g",
              gdp_dtype_name(out_dtypes[d]), (long long)bad, (long long)worst, got[worst], want[worst]);
        free(got);
        free(y.data);
    }
    /* bf16 input, fp32 output: the rows as read. */
    gdp_tensor xb = test_tensor_alloc(GDP_DTYPE_BF16, 3, shape), yb = test_tensor_alloc(GDP_DTYPE_FP32, 3, shape);
    for (int64_t i = 0; i < rows * K; i++) gdp_tensor_set(&xb, i, gdp_tensor_get(&x, i));
    double *want_b = test_tensor_f64(&xb);
    for (int64_t row = 0; row < rows; row++) l2norm_row(want_b + row * K, K);
    CHECK_OK(gdp_l2norm(ctx, &yb, &xb));
    double *got_b = test_tensor_f64(&yb);
    CHECK(test_count_bad(got_b, want_b, rows * K, 0.0, unit_roundoff(GDP_DTYPE_FP32), NULL) == 0,
          "l2norm bf16 -> fp32 beyond rounding");
    /* In place gives the same bits as out of place. */
    gdp_tensor y_out = test_tensor_alloc(GDP_DTYPE_FP32, 3, shape), x_copy = test_tensor_alloc(GDP_DTYPE_FP32, 3, shape);
    memcpy(x_copy.data, x.data, test_tensor_bytes(&x));
    CHECK_OK(gdp_l2norm(ctx, &y_out, &x));
    CHECK_OK(gdp_l2norm(ctx, &x_copy, &x_copy));
    CHECK(memcmp(y_out.data, x_copy.data, test_tensor_bytes(&x)) == 0, "l2norm in place differs from out of place");

    /* Rejected: nothing written. */
    const int64_t bad_shape[3] = {2, 3, K + 1};
    gdp_tensor y_bad = test_tensor_alloc(GDP_DTYPE_FP32, 3, bad_shape);
    memset(y_bad.data, 0xee, test_tensor_bytes(&y_bad));
    CHECK_STATUS(gdp_l2norm(ctx, &y_bad, &x), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(bytes_equal_to(y_bad.data, test_tensor_bytes(&y_bad), 0xee), "l2norm wrote y after a shape error");
    CHECK(strlen(gdp_last_error()) > 0, "no message");
    gdp_tensor y_alias = xb; /* a bf16 buffer viewed as fp32 overlaps x without being an exact alias */
    y_alias.dtype = GDP_DTYPE_FP32;
    y_alias.shape[0] = 1;
    y_alias.shape[1] = 3;
    gdp_tensor x_half = xb;
    x_half.shape[0] = 1;
    x_half.shape[1] = 3;
    unsigned char *xb_before = malloc(test_tensor_bytes(&xb));
    memcpy(xb_before, xb.data, test_tensor_bytes(&xb));
    CHECK_STATUS(gdp_l2norm(ctx, &y_alias, &x_half), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(memcmp(xb_before, xb.data, test_tensor_bytes(&xb)) == 0, "l2norm wrote through a rejected alias");
    gdp_tensor x_int = x;
    x_int.dtype = GDP_DTYPE_INT32;
    CHECK_STATUS(gdp_l2norm(ctx, &y_out, &x_int), GDP_STATUS_INVALID_ARGUMENT);
    gdp_tensor x_scalar = x;
    x_scalar.ndim = 0;
    CHECK_STATUS(gdp_l2norm(ctx, &y_out, &x_scalar), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_l2norm(ctx, NULL, &x), GDP_STATUS_INVALID_ARGUMENT);
    printf("l2norm: fp32/bf16/fp16 outputs within rounding of the double formula, in place, rejections\n");
    free(want); free(want_b); free(got_b); free(xb_before);
    free(x.data); free(xb.data); free(yb.data); free(y_out.data); free(x_copy.data); free(y_bad.data);
}

static void test_cumsum(gdp_ctx_t ctx) {
    static const int32_t cu_vals[4] = {0, 70, 70, 200};
    const int64_t N = 3, T = 220, H = 3, M = 3;
    test_rng r;
    test_rng_seed(&r, 6006);
    const int64_t g_shape[3] = {1, T, H}, dp_shape[3] = {1, T * M, H}, cu_shape[1] = {N + 1};
    gdp_tensor g = test_tensor_alloc(GDP_DTYPE_FP32, 3, g_shape);
    for (int64_t i = 0; i < T * H; i++) gdp_tensor_set(&g, i, draw_decay(&r));
    gdp_tensor cu = test_tensor_alloc(GDP_DTYPE_INT32, 1, cu_shape);
    memcpy(cu.data, cu_vals, sizeof cu_vals);
    gdp_tensor gq = test_tensor_alloc(GDP_DTYPE_FP32, 3, g_shape), gk = test_tensor_alloc(GDP_DTYPE_FP32, 3, dp_shape);
    memset(gq.data, 0xff, test_tensor_bytes(&gq));
    memset(gk.data, 0xff, test_tensor_bytes(&gk));
    CHECK_OK(gdp_chunk_local_cumsum(ctx, &gq, &gk, &g, &cu, (int32_t)M));

    /* Direct formula: R * (sum of g since the start of the local chunk), per stream. */
    double *want_q = calloc((size_t)(T * H), sizeof(double)), *want_k = calloc((size_t)(T * M * H), sizeof(double));
    for (int64_t i = 0; i < N; i++) {
        const int64_t bos = cu_vals[i], L = cu_vals[i + 1] - cu_vals[i];
        for (int64_t h = 0; h < H; h++) {
            for (int64_t t = 0; t < L; t++) {
                double s = 0;
                for (int64_t u = t / CHUNK * CHUNK; u <= t; u++) s += gdp_tensor_get(&g, (bos + u) * H + h);
                want_q[(bos + t) * H + h] = (double)GDP_RCP_LN2 * s;
            }
            for (int64_t j = 0; j < L * M; j++) {
                double s = 0;
                for (int64_t u = j / CHUNK * CHUNK; u <= j; u++)
                    if (u % M == 0) s += gdp_tensor_get(&g, (bos + u / M) * H + h);
                want_k[(bos * M + j) * H + h] = (double)GDP_RCP_LN2 * s;
            }
        }
    }
    double *got_q = test_tensor_f64(&gq), *got_k = test_tensor_f64(&gk);
    CHECK(test_count_bad(got_q, want_q, T * H, 0.0, unit_roundoff(GDP_DTYPE_FP32), NULL) == 0,
          "token-stream cumsum beyond fp32 rounding of the double formula");
    CHECK(test_count_bad(got_k, want_k, T * M * H, 0.0, unit_roundoff(GDP_DTYPE_FP32), NULL) == 0,
          "expanded-stream cumsum beyond fp32 rounding of the double formula");
    CHECK(bytes_equal_to((float *)gq.data + cu_vals[N] * H, (size_t)((T - cu_vals[N]) * H) * 4, 0),
          "token-stream rows past cu_seqlens[N] not 0");
    CHECK(bytes_equal_to((float *)gk.data + cu_vals[N] * M * H, (size_t)((T - cu_vals[N]) * M * H) * 4, 0),
          "expanded rows past M*cu_seqlens[N] not 0");

    /* Only one output: the same values. */
    gdp_tensor gk2 = test_tensor_alloc(GDP_DTYPE_FP32, 3, dp_shape);
    CHECK_OK(gdp_chunk_local_cumsum(ctx, NULL, &gk2, &g, &cu, (int32_t)M));
    CHECK(memcmp(gk2.data, gk.data, test_tensor_bytes(&gk)) == 0, "cumsum with only g_cumsum_dp differs");

    /* Rejected: nothing written. */
    memcpy(gk2.data, gk.data, test_tensor_bytes(&gk));
    memset(gq.data, 0xee, test_tensor_bytes(&gq));
    CHECK_STATUS(gdp_chunk_local_cumsum(ctx, NULL, NULL, &g, &cu, (int32_t)M), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_chunk_local_cumsum(ctx, &gq, &gk, &g, &cu, 0), GDP_STATUS_INVALID_ARGUMENT);
    gdp_tensor gk_wrong = gk;
    gk_wrong.shape[1] = T * (M + 1);
    CHECK_STATUS(gdp_chunk_local_cumsum(ctx, &gq, &gk_wrong, &g, &cu, (int32_t)M), GDP_STATUS_INVALID_ARGUMENT);
    int32_t *cuw = cu.data;
    cuw[2] = 60; /* decreasing */
    CHECK_STATUS(gdp_chunk_local_cumsum(ctx, &gq, &gk, &g, &cu, (int32_t)M), GDP_STATUS_INVALID_ARGUMENT);
    cuw[2] = 70;
    cuw[3] = (int32_t)T + 1; /* past the tokens */
    CHECK_STATUS(gdp_chunk_local_cumsum(ctx, &gq, &gk, &g, &cu, (int32_t)M), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(bytes_equal_to(gq.data, test_tensor_bytes(&gq), 0xee), "cumsum wrote g_cumsum on a rejected call");
    CHECK(memcmp(gk2.data, gk.data, test_tensor_bytes(&gk)) == 0, "cumsum wrote g_cumsum_dp on a rejected call");
    printf("chunk_local_cumsum: both streams within fp32 rounding of the direct sums, tails 0, rejections\n");
    free(want_q); free(want_k); free(got_q); free(got_k);
    free(g.data); free(cu.data); free(gq.data); free(gk.data); free(gk2.data);
}

/* ==== 6. the profile around a CPU chunk call ===================================================== */
static void test_profile(gdp_ctx_t ctx) {
    static const batch_spec sp = {"profile", 2, {100, 30}, 2, 2, 2, 64, 32, GDP_DTYPE_FP32, GDP_DTYPE_FP32,
                                  GDP_DTYPE_FP32, GDP_DTYPE_FP32, true, true, true, 1, 0.0};
    test_rng r;
    test_rng_seed(&r, 606);
    batch b;
    batch_make(&b, &sp, &r);
    const int64_t o_shape[4] = {1, b.T, sp.H, sp.V};
    gdp_tensor o = test_tensor_alloc(GDP_DTYPE_FP32, 4, o_shape);
    gdp_chunk_args a = batch_args(&b);
    a.o = o;
    gdp_phase_times t;
    memset(&t, 0xff, sizeof t);
    CHECK_OK(gdp_profile_begin(ctx));
    CHECK_OK(gdp_chunk_gated_delta_product_varlen(ctx, &a));
    CHECK_OK(gdp_profile_end(ctx, &t));
    CHECK(t.ops_s > 0 && t.gemm_s == 0 && t.collective_s == 0 && t.head_s == 0 && t.total_s >= t.ops_s,
          "profile of a CPU chunk call: ops %g gemm %g coll %g head %g total %g s", t.ops_s, t.gemm_s, t.collective_s,
          t.head_s, t.total_s);
    static const char *const names[GDP_CHUNK_STAGE_NUM] = {"cumsum", "wy",          "state",       "out",
                                                           "fused",  "split-runs", "split-fixup", "split-correct"};
    for (int i = 0; i < GDP_CHUNK_STAGE_NUM; i++) {
        CHECK(t.chunk_s[i] == 0, "profile: the CPU backend reports a %s stage of %g s", names[i], t.chunk_s[i]);
        const char *name = gdp_chunk_stage_name((gdp_chunk_stage_t)i);
        CHECK(name != NULL && strcmp(name, names[i]) == 0, "gdp_chunk_stage_name(%d) is %s, not %s", i,
              name != NULL ? name : "NULL", names[i]);
    }
    CHECK(gdp_chunk_stage_name(GDP_CHUNK_STAGE_NUM) == NULL && gdp_chunk_stage_name((gdp_chunk_stage_t)-1) == NULL,
          "gdp_chunk_stage_name names a stage out of range");
    printf("profile: a CPU chunk call is %.3g ms of GDP ops, no chunk stages\n", t.ops_s * 1e3);
    free(o.data);
    batch_free(&b);
}

/* ==== 7. exact segments: the segmented algorithm against the recurrence ==================== */
static int64_t g_segment_chunks = 1;
static gdp_status_t segmented_fn(const gdp_cpu_seq_head *p) { return gdp_cpu_segmented_seq_head(p, g_segment_chunks); }
static gdp_status_t corrected_fn(const gdp_cpu_seq_head *p) {
    return gdp_cpu_segmented_corrected_seq_head(p, g_segment_chunks);
}

static void test_segments(void) {
    static const int64_t Ls[7] = {1, 63, 64, 65, 130, 257, 300};
    static const int64_t Ms[4] = {1, 2, 3, 5};
    static const int64_t Ks[3] = {32, 16, 64}, Vs[3] = {16, 40, 24};
    static const int64_t SEGS[4] = {1, 2, 3, 7};
    test_rng r;
    test_rng_seed(&r, 2212);
    int cases = 0, straddling = 0, multi = 0;
    for (int li = 0; li < 7; li++)
        for (int mi = 0; mi < 4; mi++) {
            const int64_t L = Ls[li], M = Ms[mi], K = Ks[(li + mi) % 3], V = Vs[(2 * li + mi) % 3];
            const bool init = (li + mi) % 2 == 1, l2norm = (li + 2 * mi) % 3 == 0;
            const int exact = (li + mi) % 4 != 0;
            const double scale = 1.0 / sqrt((double)K);
            seq_inputs s;
            seq_inputs_make(&s, &r, L, M, K, V, l2norm, init);
            const int64_t nc = ceil_div(L, CHUNK), nexp = ceil_div(L * M, CHUNK);
            double *o_n = calloc((size_t)(L * V + 1), sizeof(double)), *s_n = calloc((size_t)(K * V), sizeof(double));
            double *h_n = calloc((size_t)(nc * K * V + 1), sizeof(double));
            double *o_c = calloc((size_t)(L * V + 1), sizeof(double)), *s_c = calloc((size_t)(K * V), sizeof(double));
            double *h_c = calloc((size_t)(nc * K * V + 1), sizeof(double));
            double *o_s = calloc((size_t)(L * V + 1), sizeof(double)), *s_s = calloc((size_t)(K * V), sizeof(double));
            double *h_s = calloc((size_t)(nc * K * V + 1), sizeof(double));
            CHECK_OK(run_seq(gdp_cpu_recurrent_seq_head, &s, L, scale, exact, o_n, s_n, h_n));
            CHECK_OK(run_seq(gdp_cpu_chunked_seq_head, &s, L, scale, exact, o_c, s_c, h_c));
            for (int si = 0; si < 4; si++) {
                g_segment_chunks = SEGS[si];
                memset(o_s, 0, (size_t)(L * V + 1) * sizeof(double));
                memset(h_s, 0, (size_t)(nc * K * V + 1) * sizeof(double));
                CHECK_OK(run_seq(segmented_fn, &s, L, scale, exact, o_s, s_s, h_s));
                char what[200];
                snprintf(what, sizeof what, "segments of %lld: L=%lld M=%lld K=%lld V=%lld init=%d l2=%d exact=%d",
                         (long long)SEGS[si], (long long)L, (long long)M, (long long)K, (long long)V, init, l2norm,
                         exact);
                check_seq_run(what, " vs recurrence", o_s, s_s, h_s, o_n, s_n, h_n, L, K, V, nc);
                check_seq_run(what, " vs chunked", o_s, s_s, h_s, o_c, s_c, h_c, L, K, V, nc);
                /* the GPU's order: outputs by correction (o^G + O^F S_j), no chunk states */
                memset(o_s, 0, (size_t)(L * V + 1) * sizeof(double));
                CHECK_OK(run_seq(corrected_fn, &s, L, scale, exact, o_s, s_s, h_s));
                char w[260];
                snprintf(w, sizeof w, "%s, corrected: o vs recurrence", what);
                check_double(w, o_s, o_n, L * V);
                snprintf(w, sizeof w, "%s, corrected: final state vs recurrence", what);
                check_double(w, s_s, s_n, K * V);
                /* a segment boundary inside a token's copies: 64 j S is not a multiple of M */
                for (int64_t b = SEGS[si]; b < nexp; b += SEGS[si])
                    if ((b * CHUNK) % M != 0) {
                        straddling++;
                        break;
                    }
                multi += nexp > SEGS[si];
                cases++;
            }
            free(o_n); free(s_n); free(h_n); free(o_c); free(s_c); free(h_c); free(o_s); free(s_s); free(h_s);
            seq_inputs_free(&s);
        }
    CHECK(straddling > 0 && multi > cases / 2, "segments: %d cases straddle a token, %d of %d have several segments",
          straddling, multi, cases);
    /* a segment of no chunk is refused */
    {
        seq_inputs s;
        seq_inputs_make(&s, &r, 5, 1, 16, 16, false, false);
        double o[5 * 16], st[16 * 16], h[16 * 16];
        g_segment_chunks = 0;
        CHECK(run_seq(segmented_fn, &s, 5, 0.25, 1, o, st, h) == GDP_STATUS_INVALID_ARGUMENT,
              "segments: segment_chunks 0 accepted");
        CHECK(run_seq(corrected_fn, &s, 5, 0.25, 1, o, st, h) == GDP_STATUS_INVALID_ARGUMENT,
              "segments, corrected: segment_chunks 0 accepted");
        CHECK(strstr(gdp_last_error(), "segment_chunks is 0") != NULL, "segments: the refusal does not name the value: %s",
              gdp_last_error());
        seq_inputs_free(&s);
    }
    printf("exact segments: %d cases (%d with a token straddling a segment boundary, %d with several segments), "
           "segmented vs recurrence and chunked, corrected vs recurrence, within %.0e\n",
           cases, straddling, multi, DOUBLE_BAR);
}

int main(void) {
    gdp_ctx_t ctx;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    test_double_sweep();
    test_batches(ctx);
    test_cache_mode(ctx);
    test_bad_inputs(ctx);
    test_l2norm(ctx);
    test_cumsum(ctx);
    test_profile(ctx);
    test_segments();
    gdp_ctx_free(ctx);
    return test_finish("test_chunk_cpu");
}
