/*
 * recurrent_ref.c: the oracle of the chunked prefill: the naive per-token recurrence of
 * gdp-math.md section 2 for one (sequence, head), in double. The varlen plumbing (gather,
 * L2 norm, initial state, outputs, cache slots) is the driver of chunk.c, shared with the
 * chunked algorithm, so the two differ only in the math under test.
 */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

gdp_status_t gdp_cpu_recurrent_seq_head(const gdp_cpu_seq_head *p) {
    const int64_t L = p->len, M = p->num_householder, K = p->key_dim, V = p->value_dim;
    double *S = p->state; /* (K, V), S[k][v] */
    double *delta = gdp_calloc((size_t)V, sizeof(double), "recurrence delta");
    if (delta == NULL)
        return GDP_STATUS_SYSTEM_ERROR;

    for (int64_t t = 0; t < L; t++) {
        /* The state after the first 64c tokens is the one entering token chunk c. */
        if (t % GDP_CHUNK_SIZE == 0)
            memcpy(p->chunk_states + (t / GDP_CHUNK_SIZE) * K * V, S, (size_t)(K * V) * sizeof(double));

        /* Decay once per token, before the copies. exp2(R g) is what the chunked version
         * computes per token (2^(R sum g) over a chunk); with the exact R it is exp(g). */
        const double decay = p->exact_log2e ? exp(p->g[t]) : exp2(p->log2e * p->g[t]);
        for (int64_t c = 0; c < K * V; c++)
            S[c] *= decay;

        for (int64_t m = 0; m < M; m++) {
            const int64_t j = t * M + m;
            const double *kj = p->k + j * K, *vj = p->v + j * V;
            /* delta = beta (v - S^T k); S += k (x) delta */
            for (int64_t c = 0; c < V; c++)
                delta[c] = vj[c];
            for (int64_t r = 0; r < K; r++)
                for (int64_t c = 0; c < V; c++)
                    delta[c] -= kj[r] * S[r * V + c];
            for (int64_t c = 0; c < V; c++)
                delta[c] *= p->beta[j];
            for (int64_t r = 0; r < K; r++)
                for (int64_t c = 0; c < V; c++)
                    S[r * V + c] += kj[r] * delta[c];
        }

        /* The query reads after the last copy: o_t = scale S^T q_t. */
        double *ot = p->o + t * V;
        const double *qt = p->q + t * K;
        for (int64_t c = 0; c < V; c++)
            ot[c] = 0.0;
        for (int64_t r = 0; r < K; r++)
            for (int64_t c = 0; c < V; c++)
                ot[c] += qt[r] * S[r * V + c];
        for (int64_t c = 0; c < V; c++)
            ot[c] *= p->scale;
    }
    free(delta);
    return GDP_STATUS_SUCCESS;
}
