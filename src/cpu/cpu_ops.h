/*
 * cpu_ops.h: the CPU reference backend (src/cpu/): plain C, double math, host memory.
 * The op front-ends (src/ops_*.c) validate every argument first, then call these
 * functions, which compute into scratch memory and write the caller's outputs only
 * once nothing can fail any more (so a failing call modifies nothing).
 *
 * One section per op family. To add a family, append a new section at the end of the
 * file (before the closing #endif) and leave the others as they are.
 */
#ifndef GDP_CPU_OPS_H
#define GDP_CPU_OPS_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== chunk family: L2 norm, chunk-local cumsums, chunked prefill and its oracle ====
 * src/cpu/chunk.c (L2 norm, cumsums, the varlen driver and the chunked algorithm of
 * gdp-math.md 3.7) and src/cpu/recurrent_ref.c (the per-token recurrence of section 2). */

/* sum a[i] b[i] over [0, n), in double, in index order. */
double gdp_cpu_dot(const double *a, const double *b, int64_t n);

/* x[0..n) <- x / sqrt(sum x^2 + GDP_L2NORM_EPS), in double, in place. */
void gdp_cpu_l2norm_row(double *x, int64_t n);

/* Chunk-local inclusive cumulative sums of one sequence's stream, restarted every
 * GDP_CHUNK_SIZE elements (x[0] starts a chunk): out[j] = log2e * sum x[chunk start..j].
 * Summed in double, then multiplied (gdp-math.md 3.1). out may equal x. */
void gdp_cpu_local_cumsum(const double *x, int64_t n, double log2e, double *out);

/* gdp_l2norm on host tensors (already validated: same shape, float dtypes). */
gdp_status_t gdp_cpu_l2norm(gdp_tensor *y, const gdp_tensor *x);

/* gdp_chunk_local_cumsum on host tensors (already validated; cu_seqlens checked:
 * cu_seqlens[0] == 0, non-decreasing, cu_seqlens[num_seqs] <= T). Either output may be
 * absent (data == NULL). */
gdp_status_t gdp_cpu_chunk_local_cumsum(gdp_tensor *g_cumsum, gdp_tensor *g_cumsum_dp, const gdp_tensor *g,
                                        const int32_t *cu_seqlens, int64_t num_seqs, int32_t num_householder);

/* One (sequence, head) of the GDP forward pass, on contiguous double rows. The two
 * algorithms below fill the same outputs, so the varlen driver and the tests can run
 * either one. */
typedef struct gdp_cpu_seq_head {
    int64_t       len;             /* L tokens (0 allowed)                                  */
    int32_t       num_householder; /* M copies per token                                    */
    int64_t       key_dim;         /* K                                                     */
    int64_t       value_dim;       /* V                                                     */
    double        scale;           /* applied to every output                               */
    double        log2e;           /* R: decays are exp2(R * sum g)                          */
    int32_t       exact_log2e;     /* recurrence: decay exp(g) instead of exp2(R * g)        */
    const double *q;               /* (L, K), already L2-normalized if the op asks for it   */
    const double *k;               /* (L*M, K), row t*M + m = token t, copy m               */
    const double *v;               /* (L*M, V)                                              */
    const double *beta;            /* (L*M)                                                 */
    const double *g;               /* (L) natural-log decays                                */
    double       *state;           /* (K, V): the initial state in, the final state out     */
    double       *o;               /* (L, V) out, scale included                            */
    double       *chunk_states;    /* (ceil(L/64), K, V) out: the state entering each token
                                      chunk, i.e. after the first 64c tokens                */
} gdp_cpu_seq_head;

/* The algorithm the varlen driver runs per (sequence, head). Returns SYSTEM_ERROR
 * (message recorded) when its scratch memory cannot be allocated. */
typedef gdp_status_t (*gdp_cpu_seq_head_fn)(const gdp_cpu_seq_head *p);

/* The chunked algorithm of gdp-math.md 3.7 (WY factors per expanded chunk, state sweep,
 * output combine per token chunk), in double without intermediate rounding. */
gdp_status_t gdp_cpu_chunked_seq_head(const gdp_cpu_seq_head *p);

/* The naive per-token recurrence of gdp-math.md section 2, in double: the oracle. */
gdp_status_t gdp_cpu_recurrent_seq_head(const gdp_cpu_seq_head *p);

/* The same outputs by exact context parallelism (chunk_segments.c): the expanded chunks cut into
 * segments of segment_chunks chunks, each segment's affine transfer map [F | G] on its own, a
 * fix-up scan S_(j+1) = F_j S_j + G_j, then every segment from its entering state. In double; the
 * oracle of the in-GPU segment split (issue 13 item 2). INVALID_ARGUMENT for segment_chunks < 1. */
gdp_status_t gdp_cpu_segmented_seq_head(const gdp_cpu_seq_head *p, int64_t segment_chunks);
/* The same split in the GPU's order: segment 0 from the initial state, every later segment's maps F
 * and G with their outputs' parts O^F and o^G, the fix-up scan, then o = o^G + O^F S_j (no second
 * pass; chunk_states is not written). The same refusal. */
gdp_status_t gdp_cpu_segmented_corrected_seq_head(const gdp_cpu_seq_head *p, int64_t segment_chunks);

/* The varlen op on host tensors, shared by gdp_chunk_gated_delta_product_varlen and
 * gdp_gated_delta_product_recurrent_ref: gathers each (sequence, head) into double rows
 * (with the optional L2 norm and the initial state), runs `algorithm`, then writes o
 * (rows past cu_seqlens[N] = 0), the dense final states or the cache slots, and the
 * chunk states. `args` has passed the front-end's validation, content checks included. */
gdp_status_t gdp_cpu_chunk_varlen(const gdp_chunk_args *args, gdp_cpu_seq_head_fn algorithm);

/* ==== prepare, recurrent (decode), conv1d and norm families ====
 * src/cpu/{prepare,recurrent,conv1d,norm}.c. The gdp_cpu_* functions are called after the
 * front-end has checked every shape and dtype rule that holds on all backends (internal.h);
 * they add the checks that need host data (slot indices, cu_seqlens values), all before
 * their first write, so a failing call still modifies nothing. */

/* The slot of request `row`: indices[row], or row itself when indices is absent. */
static inline int64_t gdp_cpu_slot_of(const gdp_tensor *indices, int64_t row) {
    if (!gdp_tensor_present(indices))
        return row;
    return ((const int32_t *)indices->data)[gdp_tensor_offset(indices, row)];
}

/* n contiguous elements of a cache tensor (a conv window, a state block) from element off,
 * as doubles, and back (rounded to its dtype). */
static inline void gdp_cpu_load_run(const gdp_tensor *t, int64_t off, int64_t n, double *dst) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = gdp_load_elem(t->data, t->dtype, off + i);
}
static inline void gdp_cpu_store_run(gdp_tensor *t, int64_t off, int64_t n, const double *src) {
    for (int64_t i = 0; i < n; i++)
        gdp_store_elem(t->data, t->dtype, off + i, src[i]);
}

/* Checks the values of a slot-index array of `rows` requests (host memory) against a
 * cache of `slots` slots: each is -1 (padding) or in [0, slots), and no slot is named
 * by two requests (their in-place updates would race). Names the row and value. */
gdp_status_t gdp_cpu_check_slots(const char *op, const char *name, const gdp_tensor *indices, int64_t rows,
                                 int64_t slots);

/* gdp_decode_prepare (decode != 0) / gdp_prefill_prepare: copies and float gating. */
gdp_status_t gdp_cpu_prepare(const gdp_prepare_args *args, int decode);

/* gdp_fused_recurrent_gated_delta_rule_update in double. */
gdp_status_t gdp_cpu_recurrent_update(const gdp_recurrent_args *args);

/* gdp_causal_conv1d_update / gdp_causal_conv1d_varlen, double accumulation. */
gdp_status_t gdp_cpu_conv1d_update(const gdp_conv1d_update_args *args);
gdp_status_t gdp_cpu_conv1d_varlen(const gdp_conv1d_varlen_args *args);

/* gdp_gated_rmsnorm / gdp_rmsnorm in double; rows = numel / d, d = last extent. */
gdp_status_t gdp_cpu_gated_rmsnorm(gdp_tensor *out, const gdp_tensor *y, const gdp_tensor *z,
                                   const gdp_tensor *weight, int64_t group_size, double eps);
gdp_status_t gdp_cpu_rmsnorm(gdp_tensor *out, const gdp_tensor *x, const gdp_tensor *weight, double eps);

#ifdef __cplusplus
}
#endif

#endif /* GDP_CPU_OPS_H */
