/*
 * chunk_segments.c: the chunk op of one (sequence, head) by exact context parallelism over
 * segments of expanded chunks, in double: the oracle of the in-GPU segment split that issue 13
 * item 2 asks for (kernels/NOTES-chunk.md, "Exact segments"), and the proof that the split is
 * exact, not an approximation.
 *
 * Each expanded chunk c maps the state entering it affinely (gdp-math.md 3.2-3.5):
 *   v_new = (I + A)^-1 diag(beta) (V - diag(2^Gk) K S)
 *   S'    = 2^gl S + K^T diag(2^(gl - Gk)) v_new   =   F_c S + G_c,
 * with F_c (K x K) = 2^gl I - K^T diag(2^(gl - Gk)) (I + A)^-1 diag(beta 2^Gk) K independent of V
 * and of S. A segment of chunks composes to S_end = F S_start + G. So:
 *   1. every segment but the last, independently: (F_j, G_j) by running its chunks on the
 *      augmented state [F | G] (K x (K + V)) from [I | 0] with the values [0 | V];
 *   2. the fix-up scan: S_0 = the initial state, S_(j+1) = F_j S_j + G_j;
 *   3. every segment, independently, from S_j: its outputs and chunk states; the last one's end
 *      state is the final state.
 * The outputs follow the one-pass GPU kernels' decomposition: token t's output is formed in the
 * expanded chunk that holds its last copy (local row r_t), from the state entering that chunk:
 *   o_t = scale (2^Gk[r_t] q_t S + sum_(s <= r_t in the chunk) 2^(Gk[r_t] - Gk[s]) <q_t, k_s> v_new_s),
 * so a token whose copies straddle a chunk or segment boundary is exact too (its earlier copies
 * are in S). Segments start at any expanded chunk boundary.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "internal.h"

#define CHUNK GDP_CHUNK_SIZE

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The end of segment j's expanded chunks (the last segment may be shorter). */
static int64_t seg_end(int64_t j, int64_t segment_chunks, int64_t nexp) {
    return (j + 1) * segment_chunks < nexp ? (j + 1) * segment_chunks : nexp;
}

/* What one pass over a range of chunks needs: the sequence, its expanded-stream cumsum, scratch. */
typedef struct seg_ctx {
    const gdp_cpu_seq_head *p;
    double *gk;           /* (L M): chunk-local cumsum of the expanded decays, base 2 */
    double *a;            /* CHUNK x CHUNK */
    double *vn;           /* CHUNK x W: v_new of the chunk */
} seg_ctx;

/* Chunk c applied to the K x W state S in place. Values: column v_col0 + j of row r is v[r][j]
 * (j < V), every other column 0 (the augmented pass: v_col0 = K, W = K + V; the real pass:
 * v_col0 = 0, W = V; the map F alone: v_col0 = W = K). o != NULL: the outputs of the tokens whose
 * last copy lies in the chunk, of S's first o_cols columns (rows of o_cols in o). */
static void seg_chunk(const seg_ctx *x, int64_t c, double *S, int64_t W, int64_t v_col0, double *o, int64_t o_cols) {
    const gdp_cpu_seq_head *p = x->p;
    const int64_t M = p->num_householder, K = p->key_dim, V = p->value_dim, LM = p->len * M;
    const int64_t lo = c * CHUNK, n = LM - lo < CHUNK ? LM - lo : CHUNK;
    const double *kc = p->k + lo * K, *gc = x->gk + lo, *bc = p->beta + lo;
    double *a = x->a, *vn = x->vn;

    /* A[r][s] = beta_r 2^(Gk_r - Gk_s) <k_r, k_s>, s < r */
    for (int64_t r = 0; r < n; r++)
        for (int64_t s = 0; s < r; s++)
            a[r * CHUNK + s] = bc[r] * exp2(gc[r] - gc[s]) * gdp_cpu_dot(kc + r * K, kc + s * K, K);
    /* v_new by forward substitution on I + A: row r = beta_r (v_r - 2^Gk_r k_r S) - sum_(s<r) A[r][s] v_new_s */
    for (int64_t r = 0; r < n; r++) {
        double *vr = vn + r * W;
        const double gam = exp2(gc[r]);
        for (int64_t j = 0; j < W; j++) {
            double ks = 0.0;
            for (int64_t d = 0; d < K; d++)
                ks += kc[r * K + d] * S[d * W + j];
            const double val = j >= v_col0 && j < v_col0 + V ? p->v[(lo + r) * V + (j - v_col0)] : 0.0;
            vr[j] = bc[r] * (val - gam * ks);
        }
        for (int64_t s = 0; s < r; s++) {
            const double ars = a[r * CHUNK + s];
            for (int64_t j = 0; j < W; j++)
                vr[j] -= ars * vn[s * W + j];
        }
    }
    /* the outputs, from the state entering the chunk */
    if (o != NULL) {
        for (int64_t t = lo / M; t <= (lo + n - 1) / M; t++) {
            const int64_t rt = t * M + M - 1 - lo; /* the token's last copy: a row of this chunk? */
            if (rt >= n)
                continue;
            const double *qt = p->q + t * K;
            double *ot = o + t * o_cols;
            const double inter = exp2(gc[rt]);
            for (int64_t j = 0; j < o_cols; j++) {
                double qs = 0.0;
                for (int64_t d = 0; d < K; d++)
                    qs += qt[d] * S[d * W + j];
                ot[j] = inter * qs;
            }
            for (int64_t s = 0; s <= rt; s++) {
                const double w = exp2(gc[rt] - gc[s]) * gdp_cpu_dot(qt, kc + s * K, K);
                for (int64_t j = 0; j < o_cols; j++)
                    ot[j] += w * vn[s * W + j];
            }
            for (int64_t j = 0; j < o_cols; j++)
                ot[j] *= p->scale;
        }
    }
    /* S <- 2^gl S + sum_r k_r^T 2^(gl - Gk_r) v_new_r */
    const double gl = gc[n - 1], decay = exp2(gl);
    for (int64_t e = 0; e < K * W; e++)
        S[e] *= decay;
    for (int64_t r = 0; r < n; r++) {
        const double f = exp2(gl - gc[r]);
        for (int64_t d = 0; d < K; d++) {
            const double kd = kc[r * K + d] * f;
            for (int64_t j = 0; j < W; j++)
                S[d * W + j] += kd * vn[r * W + j];
        }
    }
}

/* The refusal both orders share. */
static gdp_status_t seg_check(int64_t segment_chunks) {
    if (segment_chunks < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "segment_chunks is %lld; a segment holds at least one chunk",
                 (long long)segment_chunks);
    return GDP_STATUS_SUCCESS;
}

/* The scratch both orders share, for states of up to W columns: A, v_new, and the expanded stream's
 * chunk-local base-2 cumsum of the decays (copy 0 of a token carries its g, the other copies 0).
 * SYSTEM_ERROR when out of memory; x can be freed (seg_ctx_free) either way. */
static gdp_status_t seg_ctx_init(const gdp_cpu_seq_head *p, int64_t W, seg_ctx *x) {
    const int64_t M = p->num_householder, LM = p->len * M;
    x->p = p;
    x->gk = gdp_calloc((size_t)LM, sizeof(double), "segments Gk");
    x->a = gdp_calloc((size_t)(CHUNK * CHUNK), sizeof(double), "segments A");
    x->vn = gdp_calloc((size_t)(CHUNK * W), sizeof(double), "segments v_new");
    if (x->gk == NULL || x->a == NULL || x->vn == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    for (int64_t j = 0; j < LM; j++)
        x->gk[j] = j % M == 0 ? p->g[j / M] : 0.0;
    gdp_cpu_local_cumsum(x->gk, LM, p->log2e, x->gk);
    return GDP_STATUS_SUCCESS;
}

/* One step of the fix-up scan over segments, S_(j+1) = F_j S_j + G_j (K x V states; F's rows ldf apart,
 * G's ldg: both orders keep their maps in their own layout), summed from G in k order. */
static void seg_fixup_step(const double *F, int64_t ldf, const double *G, int64_t ldg, const double *Sj, double *Sn,
                           int64_t K, int64_t V) {
    for (int64_t d = 0; d < K; d++)
        for (int64_t e = 0; e < V; e++) {
            double s = G[d * ldg + e];
            for (int64_t i = 0; i < K; i++)
                s += F[d * ldf + i] * Sj[i * V + e];
            Sn[d * V + e] = s;
        }
}

static void seg_ctx_free(seg_ctx *x) {
    free(x->gk);
    free(x->a);
    free(x->vn);
}

gdp_status_t gdp_cpu_segmented_seq_head(const gdp_cpu_seq_head *p, int64_t segment_chunks) {
    const int64_t L = p->len, M = p->num_householder, K = p->key_dim, V = p->value_dim, LM = L * M;
    GDP_CHECK(seg_check(segment_chunks));
    if (L == 0)
        return GDP_STATUS_SUCCESS; /* no chunk: the state passes through unchanged */
    const int64_t nexp = ceil_div(LM, CHUNK), nseg = ceil_div(nexp, segment_chunks), W = K + V;

    seg_ctx x;
    gdp_status_t st = seg_ctx_init(p, W, &x);
    double *fg = gdp_calloc((size_t)(nseg * K * W), sizeof(double), "segments transfer maps");
    double *starts = gdp_calloc((size_t)(nseg * K * V), sizeof(double), "segments entering states");
    if (st != GDP_STATUS_SUCCESS || fg == NULL || starts == NULL) {
        st = GDP_STATUS_SYSTEM_ERROR;
        goto done;
    }

    /* 1. each segment's transfer map [F | G], from [I | 0] with the values [0 | V] */
    for (int64_t j = 0; j + 1 < nseg; j++) {
        double *X = fg + j * K * W;
        for (int64_t d = 0; d < K; d++)
            X[d * W + d] = 1.0;
        for (int64_t c = j * segment_chunks; c < (j + 1) * segment_chunks; c++)
            seg_chunk(&x, c, X, W, K, NULL, 0);
    }
    /* 2. the fix-up scan over segments: S_(j+1) = F_j S_j + G_j */
    memcpy(starts, p->state, (size_t)(K * V) * sizeof(double));
    for (int64_t j = 0; j + 1 < nseg; j++) {
        const double *X = fg + j * K * W;
        seg_fixup_step(X, W, X + K, W, starts + j * K * V, starts + (j + 1) * K * V, K, V);
    }
    /* 3. each segment from its entering state: outputs, chunk states, and the last one's end state */
    for (int64_t j = 0; j < nseg; j++) {
        double *S = j + 1 == nseg ? p->state : fg + j * K * W; /* the map's storage is free again */
        memcpy(S, starts + j * K * V, (size_t)(K * V) * sizeof(double));
        const int64_t c_end = seg_end(j, segment_chunks, nexp);
        for (int64_t c = j * segment_chunks; c < c_end; c++) {
            if (c % M == 0) /* expanded chunk cM starts token chunk c / M */
                memcpy(p->chunk_states + (c / M) * K * V, S, (size_t)(K * V) * sizeof(double));
            seg_chunk(&x, c, S, V, 0, p->o, V);
        }
    }

done:
    seg_ctx_free(&x);
    free(fg);
    free(starts);
    return st;
}

/* The order of the Hopper kernel's split with outputs by correction (kernels/NOTES-chunk.md, twenty-seventh
 * session; kernels/chunk/pending/hopper-split2.patch until it is measured and merged).
 * By linearity the outputs of a segment from its entering state S are o = o^G + O^F S, with o^G the
 * segment's outputs from S = 0 (the run that also gives the map G) and O^F (a row of K a token) its
 * outputs from S = I with the values taken as 0 (the run that also gives the map F). So:
 *   1. segment 0 from the initial state: its outputs, and S_1;
 *   2. every segment j >= 1, independently: G_j with o^G (written into o), and F_j with O^F;
 *   3. the fix-up scan S_(j+1) = F_j S_j + G_j (the last is the final state);
 *   4. o_t += O^F_t S_j over the tokens of every segment j >= 1.
 * Each sequence's chunks are run about twice, in pieces that run side by side, instead of three
 * times (the augmented maps and the second pass above). Chunk states are not formed (the GPU runs
 * its second pass where they are asked). */
gdp_status_t gdp_cpu_segmented_corrected_seq_head(const gdp_cpu_seq_head *p, int64_t segment_chunks) {
    const int64_t L = p->len, M = p->num_householder, K = p->key_dim, V = p->value_dim, LM = L * M;
    GDP_CHECK(seg_check(segment_chunks));
    if (L == 0)
        return GDP_STATUS_SUCCESS;
    const int64_t nexp = ceil_div(LM, CHUNK), nseg = ceil_div(nexp, segment_chunks), W = K > V ? K : V;

    seg_ctx x;
    gdp_status_t st = seg_ctx_init(p, W, &x);
    double *fmaps = gdp_calloc((size_t)(nseg * K * K), sizeof(double), "segments maps F");
    double *gmaps = gdp_calloc((size_t)(nseg * K * V), sizeof(double), "segments maps G");
    double *starts = gdp_calloc((size_t)(nseg * K * V), sizeof(double), "segments entering states");
    double *of = gdp_calloc((size_t)(L * K), sizeof(double), "segments O^F");
    if (st != GDP_STATUS_SUCCESS || fmaps == NULL || gmaps == NULL || starts == NULL || of == NULL) {
        st = GDP_STATUS_SYSTEM_ERROR;
        goto done;
    }

    /* 1. segment 0 from the initial state */
    memcpy(starts, p->state, (size_t)(K * V) * sizeof(double));
    for (int64_t c = 0; c < seg_end(0, segment_chunks, nexp); c++)
        seg_chunk(&x, c, starts, V, 0, p->o, V);
    /* 2. the maps of every later segment, with their outputs' parts */
    for (int64_t j = 1; j < nseg; j++) {
        const int64_t c_end = seg_end(j, segment_chunks, nexp);
        double *F = fmaps + j * K * K, *G = gmaps + j * K * V;
        for (int64_t d = 0; d < K; d++)
            F[d * K + d] = 1.0;
        for (int64_t c = j * segment_chunks; c < c_end; c++) {
            seg_chunk(&x, c, G, V, 0, p->o, V);
            seg_chunk(&x, c, F, K, K, of, K);
        }
    }
    /* 3. the fix-up: starts[0] holds S_1 (segment 0's end), then S_(j+1) = F_j S_j + G_j */
    for (int64_t j = 1; j < nseg; j++)
        seg_fixup_step(fmaps + j * K * K, K, gmaps + j * K * V, V, starts + (j - 1) * K * V, starts + j * K * V, K, V);
    memcpy(p->state, starts + (nseg - 1) * K * V, (size_t)(K * V) * sizeof(double));
    /* 4. the correction: segment j's tokens (their last copy in its chunks) take O^F S_j, S_j = starts[j - 1] */
    for (int64_t j = 1; j < nseg; j++) {
        const double *Sj = starts + (j - 1) * K * V;
        const int64_t lo = j * segment_chunks * CHUNK, hi = (j + 1) * segment_chunks * CHUNK;
        for (int64_t t = 0; t < L; t++) {
            const int64_t last = t * M + M - 1;
            if (last < lo || last >= hi)
                continue;
            for (int64_t e = 0; e < V; e++) {
                double s = 0.0;
                for (int64_t d = 0; d < K; d++)
                    s += of[t * K + d] * Sj[d * V + e];
                p->o[t * V + e] += s;
            }
        }
    }

done:
    seg_ctx_free(&x);
    free(fmaps);
    free(gmaps);
    free(starts);
    free(of);
    return st;
}
