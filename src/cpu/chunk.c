/*
 * chunk.c: the CPU reference of the chunk family: the L2 norm, the chunk-local
 * cumulative decays (gdp-math.md 3.1), the chunked GDP algorithm of one (sequence,
 * head) (gdp-math.md 3.7) and the varlen driver that both the chunked op and the
 * recurrent oracle (recurrent_ref.c) run through: gather inputs, run the algorithm per
 * (sequence, head), then write o, final states or cache slots, and chunk states.
 *
 * Everything is double with no intermediate rounding; outputs are rounded (RNE) to
 * each output tensor's dtype only when written, after every computation succeeded.
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

#define CHUNK GDP_CHUNK_SIZE

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double gdp_cpu_dot(const double *a, const double *b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* y[0..n) += alpha * x[0..n) */
static void axpy(double *y, double alpha, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

/* ---- L2 norm -------------------------------------------------------------------- */
void gdp_cpu_l2norm_row(double *x, int64_t n) {
    double denom = sqrt(gdp_cpu_dot(x, x, n) + GDP_L2NORM_EPS);
    for (int64_t i = 0; i < n; i++)
        x[i] /= denom;
}

gdp_status_t gdp_cpu_l2norm(gdp_tensor *y, const gdp_tensor *x) {
    int64_t row_len = x->shape[x->ndim - 1];
    int64_t numel = gdp_tensor_numel(x);
    if (row_len == 0 || numel == 0)
        return GDP_STATUS_SUCCESS;
    double *row = gdp_calloc((size_t)row_len, sizeof(double), "gdp_l2norm row");
    if (row == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    /* Row by row: each row is read completely before it is written, so y == x works. */
    for (int64_t start = 0; start < numel; start += row_len) {
        gdp_tensor_read_f64(x, start, row_len, row);
        gdp_cpu_l2norm_row(row, row_len);
        gdp_tensor_write_f64(y, start, row_len, row);
    }
    free(row);
    return GDP_STATUS_SUCCESS;
}

/* ---- chunk-local cumsums ----------------------------------------------------------- */
void gdp_cpu_local_cumsum(const double *x, int64_t n, double log2e, double *out) {
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        if (j % CHUNK == 0)
            sum = 0.0;
        sum += x[j];
        out[j] = log2e * sum;
    }
}

gdp_status_t gdp_cpu_chunk_local_cumsum(gdp_tensor *g_cumsum, gdp_tensor *g_cumsum_dp, const gdp_tensor *g,
                                        const int32_t *cu_seqlens, int64_t num_seqs, int32_t num_householder) {
    const int64_t T = g->shape[1], H = g->shape[2], M = num_householder;
    const double log2e = (double)GDP_RCP_LN2;
    int64_t max_len = 0;
    for (int64_t i = 0; i < num_seqs; i++)
        if (cu_seqlens[i + 1] - cu_seqlens[i] > max_len)
            max_len = cu_seqlens[i + 1] - cu_seqlens[i];

    /* Whole outputs in double (zero past cu_seqlens[N]), written only at the end. */
    gdp_status_t st = GDP_STATUS_SUCCESS;
    double *gq = gdp_calloc((size_t)(T * H), sizeof(double), "gdp_chunk_local_cumsum token stream");
    double *gk = gdp_calloc((size_t)(T * M * H), sizeof(double), "gdp_chunk_local_cumsum expanded stream");
    double *seq = gdp_calloc((size_t)(max_len * M), sizeof(double), "gdp_chunk_local_cumsum sequence");
    if (gq == NULL || gk == NULL || seq == NULL) {
        st = GDP_STATUS_SYSTEM_ERROR;
        goto done;
    }
    for (int64_t i = 0; i < num_seqs; i++) {
        const int64_t bos = cu_seqlens[i], len = cu_seqlens[i + 1] - cu_seqlens[i];
        for (int64_t h = 0; h < H; h++) {
            for (int64_t t = 0; t < len; t++)
                seq[t] = gdp_tensor_get(g, (bos + t) * H + h);
            gdp_cpu_local_cumsum(seq, len, log2e, seq);
            for (int64_t t = 0; t < len; t++)
                gq[(bos + t) * H + h] = seq[t];
            /* Expanded stream: the decay sits on copy 0 of each token, copies m > 0 add 0. */
            for (int64_t j = 0; j < len * M; j++)
                seq[j] = j % M == 0 ? gdp_tensor_get(g, (bos + j / M) * H + h) : 0.0;
            gdp_cpu_local_cumsum(seq, len * M, log2e, seq);
            for (int64_t j = 0; j < len * M; j++)
                gk[(bos * M + j) * H + h] = seq[j];
        }
    }
    if (gdp_tensor_present(g_cumsum))
        gdp_tensor_write_f64(g_cumsum, 0, T * H, gq);
    if (gdp_tensor_present(g_cumsum_dp))
        gdp_tensor_write_f64(g_cumsum_dp, 0, T * M * H, gk);
done:
    free(gq);
    free(gk);
    free(seq);
    return st;
}

/* ---- the chunked algorithm of one (sequence, head) ------------------------------------ */
gdp_status_t gdp_cpu_chunked_seq_head(const gdp_cpu_seq_head *p) {
    const int64_t L = p->len, M = p->num_householder, K = p->key_dim, V = p->value_dim;
    const int64_t LM = L * M;
    if (L == 0)
        return GDP_STATUS_SUCCESS; /* no chunk: the state passes through unchanged */
    const int64_t n_token_chunks = ceil_div(L, CHUNK), n_exp_chunks = ceil_div(LM, CHUNK);

    gdp_status_t st = GDP_STATUS_SUCCESS;
    double *gq = gdp_calloc((size_t)L, sizeof(double), "chunk Gq");
    double *gk = gdp_calloc((size_t)LM, sizeof(double), "chunk Gk");
    double *v_new = gdp_calloc((size_t)(LM * V), sizeof(double), "chunk v_new");
    double *a_mat = gdp_calloc((size_t)(CHUNK * CHUNK), sizeof(double), "chunk A");
    double *u = gdp_calloc((size_t)(CHUNK * V), sizeof(double), "chunk u");
    double *w = gdp_calloc((size_t)(CHUNK * K), sizeof(double), "chunk w");
    if (gq == NULL || gk == NULL || v_new == NULL || a_mat == NULL || u == NULL || w == NULL) {
        st = GDP_STATUS_SYSTEM_ERROR;
        goto done;
    }

    /* 3.1: chunk-local cumsums on both streams; the decay sits on copy 0 of each token. */
    gdp_cpu_local_cumsum(p->g, L, p->log2e, gq);
    for (int64_t j = 0; j < LM; j++)
        gk[j] = j % M == 0 ? p->g[j / M] : 0.0;
    gdp_cpu_local_cumsum(gk, LM, p->log2e, gk);

    double *S = p->state;
    for (int64_t ct = 0; ct < n_exp_chunks; ct++) {
        const int64_t a = ct * CHUNK, n = LM - a < CHUNK ? LM - a : CHUNK;
        const double *kc = p->k + a * K, *vc = p->v + a * V, *bc = p->beta + a, *gc = gk + a;

        /* Expanded chunk cM starts at token 64c, copy 0: the state entering token chunk c. */
        if (ct % M == 0)
            memcpy(p->chunk_states + (ct / M) * K * V, S, (size_t)(K * V) * sizeof(double));

        /* 3.2: A[r][s] = beta_r 2^(Gk_r - Gk_s) <k_r, k_s> for s < r (the exponent is <= 0
         * for decays <= 0; only s < r is ever evaluated, so it cannot overflow). */
        for (int64_t r = 0; r < n; r++)
            for (int64_t s = 0; s < r; s++)
                a_mat[r * CHUNK + s] = bc[r] * exp2(gc[r] - gc[s]) * gdp_cpu_dot(kc + r * K, kc + s * K, K);

        /* 3.3 + 3.4: u = (I + A)^-1 (beta v) and w = (I + A)^-1 (beta 2^Gk k), by forward
         * substitution on the unit lower-triangular I + A (same result as forming the
         * inverse, fewer operations). */
        for (int64_t r = 0; r < n; r++) {
            double *ur = u + r * V, *wr = w + r * K;
            const double wscale = bc[r] * exp2(gc[r]);
            for (int64_t c = 0; c < V; c++)
                ur[c] = bc[r] * vc[r * V + c];
            for (int64_t c = 0; c < K; c++)
                wr[c] = wscale * kc[r * K + c];
            for (int64_t s = 0; s < r; s++) {
                axpy(ur, -a_mat[r * CHUNK + s], u + s * V, V);
                axpy(wr, -a_mat[r * CHUNK + s], w + s * K, K);
            }
        }

        /* 3.5: v_new = u - w S (the true per-position deltas), then
         * S <- 2^gl S + k^T (2^(gl - Gk) v_new), gl = Gk of the chunk's last row. */
        double *vn = v_new + a * V;
        for (int64_t r = 0; r < n; r++) {
            memcpy(vn + r * V, u + r * V, (size_t)V * sizeof(double));
            for (int64_t c = 0; c < K; c++)
                axpy(vn + r * V, -w[r * K + c], S + c * V, V);
        }
        const double gl = gc[n - 1], chunk_decay = exp2(gl);
        for (int64_t c = 0; c < K * V; c++)
            S[c] *= chunk_decay;
        for (int64_t r = 0; r < n; r++) {
            const double row_decay = exp2(gl - gc[r]);
            for (int64_t c = 0; c < K; c++)
                axpy(S + c * V, kc[r * K + c] * row_decay, vn + r * V, V);
        }
    }

    /* 3.6: per token chunk c, o_t = scale [2^Gq_t (q_t h_c) + sum over tokens s <= t of
     * the chunk, over all M copies, 2^(Gq_t - Gq_s) <q_t, k_(s,m)> v_new_(s,m)]. */
    for (int64_t c = 0; c < n_token_chunks; c++) {
        const int64_t t0 = c * CHUNK, t1 = t0 + CHUNK < L ? t0 + CHUNK : L;
        const double *hc = p->chunk_states + c * K * V;
        for (int64_t t = t0; t < t1; t++) {
            const double *qt = p->q + t * K;
            double *ot = p->o + t * V;
            memset(ot, 0, (size_t)V * sizeof(double));
            for (int64_t r = 0; r < K; r++)
                axpy(ot, qt[r], hc + r * V, V);
            const double inter_decay = exp2(gq[t]);
            for (int64_t r = 0; r < V; r++)
                ot[r] *= inter_decay;
            for (int64_t s = t0; s <= t; s++) {
                const double ratio = exp2(gq[t] - gq[s]);
                for (int64_t m = 0; m < M; m++) {
                    const int64_t j = s * M + m;
                    axpy(ot, ratio * gdp_cpu_dot(qt, p->k + j * K, K), v_new + j * V, V);
                }
            }
            for (int64_t r = 0; r < V; r++)
                ot[r] *= p->scale;
        }
    }

done:
    free(gq);
    free(gk);
    free(v_new);
    free(a_mat);
    free(u);
    free(w);
    return st;
}

/* ---- the varlen driver shared by the chunked op and the oracle --------------------------- */

/* Scratch rows of one (sequence, head), sized for the longest sequence. */
typedef struct seq_head_buffers {
    double *q, *k, *v, *beta, *g, *state, *o, *chunk_states;
} seq_head_buffers;

static void free_seq_head_buffers(seq_head_buffers *b) {
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->beta);
    free(b->g);
    free(b->state);
    free(b->o);
    free(b->chunk_states);
}

static gdp_status_t alloc_seq_head_buffers(seq_head_buffers *b, int64_t max_len, int64_t M, int64_t K,
                                           int64_t V) {
    memset(b, 0, sizeof *b);
    b->q = gdp_calloc((size_t)(max_len * K), sizeof(double), "chunk q rows");
    b->k = gdp_calloc((size_t)(max_len * M * K), sizeof(double), "chunk k rows");
    b->v = gdp_calloc((size_t)(max_len * M * V), sizeof(double), "chunk v rows");
    b->beta = gdp_calloc((size_t)(max_len * M), sizeof(double), "chunk beta");
    b->g = gdp_calloc((size_t)max_len, sizeof(double), "chunk g");
    b->state = gdp_calloc((size_t)(K * V), sizeof(double), "chunk state");
    b->o = gdp_calloc((size_t)(max_len * V), sizeof(double), "chunk o rows");
    b->chunk_states = gdp_calloc((size_t)(ceil_div(max_len, CHUNK) * K * V), sizeof(double), "chunk states");
    if (b->q == NULL || b->k == NULL || b->v == NULL || b->beta == NULL || b->g == NULL || b->state == NULL ||
        b->o == NULL || b->chunk_states == NULL) {
        free_seq_head_buffers(b);
        return GDP_STATUS_SYSTEM_ERROR;
    }
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_cpu_chunk_varlen(const gdp_chunk_args *args, gdp_cpu_seq_head_fn algorithm) {
    const int64_t T = args->q.shape[1], H = args->q.shape[2], K = args->q.shape[3];
    const int64_t V = args->v.shape[3], M = args->num_householder;
    const int64_t N = args->cu_seqlens.shape[0] - 1;
    const int32_t *cu = (const int32_t *)args->cu_seqlens.data;
    const bool cache_mode = gdp_tensor_present(&args->state);
    const bool dense_final = !cache_mode && args->output_final_state;
    const int64_t KV = K * V;

    /* chunk_offsets derived from cu_seqlens (the front-end checked that given descriptors
     * agree with them), and the longest sequence for the scratch rows. */
    int64_t n_chunks = 0, max_len = 0;
    for (int64_t i = 0; i < N; i++) {
        const int64_t len = (int64_t)cu[i + 1] - cu[i];
        n_chunks += ceil_div(len, CHUNK);
        if (len > max_len)
            max_len = len;
    }

    gdp_status_t st = GDP_STATUS_SUCCESS;
    seq_head_buffers b;
    double *o_all = gdp_calloc((size_t)(T * H * V), sizeof(double), "chunk o");
    double *final_all = gdp_calloc((size_t)(N * H * KV), sizeof(double), "chunk final states");
    double *states_all = NULL;
    if (args->return_chunk_states)
        states_all = gdp_calloc((size_t)(n_chunks * H * KV), sizeof(double), "chunk states output");
    if (o_all == NULL || final_all == NULL || (args->return_chunk_states && states_all == NULL)) {
        free(o_all);
        free(final_all);
        free(states_all);
        return GDP_STATUS_SYSTEM_ERROR;
    }
    GDP_CHECK_GOTO(alloc_seq_head_buffers(&b, max_len, M, K, V), st, free_outputs);

    const double log2e = args->exact_log2e ? 1.0 / M_LN2 : (double)GDP_RCP_LN2;
    const double scale = args->scale != 0.0 ? args->scale : 1.0 / sqrt((double)K);
    int64_t chunk_offset = 0; /* chunk_offsets[i] */
    for (int64_t i = 0; i < N; i++) {
        const int64_t bos = cu[i], len = (int64_t)cu[i + 1] - cu[i];
        for (int64_t h = 0; h < H; h++) {
            /* Gather: row (t, h) of a [1, T', H, D] tensor is D contiguous logical elements. */
            for (int64_t t = 0; t < len; t++) {
                gdp_tensor_read_f64(&args->q, ((bos + t) * H + h) * K, K, b.q + t * K);
                b.g[t] = gdp_tensor_get(&args->g, (bos + t) * H + h);
            }
            for (int64_t j = 0; j < len * M; j++) {
                const int64_t row = bos * M + j;
                gdp_tensor_read_f64(&args->k, (row * H + h) * K, K, b.k + j * K);
                gdp_tensor_read_f64(&args->v, (row * H + h) * V, V, b.v + j * V);
                b.beta[j] = gdp_tensor_get(&args->beta, row * H + h);
            }
            if (args->use_qk_l2norm_in_kernel) {
                for (int64_t t = 0; t < len; t++)
                    gdp_cpu_l2norm_row(b.q + t * K, K);
                for (int64_t j = 0; j < len * M; j++)
                    gdp_cpu_l2norm_row(b.k + j * K, K);
            }
            if (gdp_tensor_present(&args->initial_state))
                gdp_tensor_read_f64(&args->initial_state, (i * H + h) * KV, KV, b.state);
            else
                memset(b.state, 0, (size_t)KV * sizeof(double));

            const gdp_cpu_seq_head p = {
                .len = len, .num_householder = (int32_t)M, .key_dim = K, .value_dim = V,
                .scale = scale, .log2e = log2e, .exact_log2e = args->exact_log2e,
                .q = b.q, .k = b.k, .v = b.v, .beta = b.beta, .g = b.g,
                .state = b.state, .o = b.o, .chunk_states = b.chunk_states,
            };
            GDP_CHECK_GOTO(algorithm(&p), st, free_all);

            for (int64_t t = 0; t < len; t++)
                memcpy(o_all + ((bos + t) * H + h) * V, b.o + t * V, (size_t)V * sizeof(double));
            memcpy(final_all + (i * H + h) * KV, b.state, (size_t)KV * sizeof(double));
            for (int64_t c = 0; states_all != NULL && c < ceil_div(len, CHUNK); c++)
                memcpy(states_all + ((chunk_offset + c) * H + h) * KV, b.chunk_states + c * KV,
                       (size_t)KV * sizeof(double));
        }
        chunk_offset += ceil_div(len, CHUNK);
    }

    /* Nothing can fail from here on: write the outputs. */
    gdp_tensor o = args->o;
    gdp_tensor_write_f64(&o, 0, T * H * V, o_all); /* rows past cu_seqlens[N] stay 0 */
    if (dense_final) {
        gdp_tensor final_state = args->final_state;
        gdp_tensor_write_f64(&final_state, 0, N * H * KV, final_all);
    }
    if (cache_mode) {
        gdp_tensor state = args->state;
        const int32_t *slots = (const int32_t *)args->state_indices.data;
        for (int64_t i = 0; i < N; i++) {
            if (slots[i] < 0)
                continue; /* -1: padding, or a request whose state the caller keeps */
            for (int64_t h = 0; h < H; h++)
                gdp_tensor_write_f64(&state, ((int64_t)slots[i] * H + h) * KV, KV, final_all + (i * H + h) * KV);
        }
    }
    if (args->return_chunk_states) {
        gdp_tensor chunk_states = args->chunk_states;
        gdp_tensor_write_f64(&chunk_states, 0, n_chunks * H * KV, states_all);
    }

free_all:
    free_seq_head_buffers(&b);
free_outputs:
    free(o_all);
    free(final_all);
    free(states_all);
    return st;
}
