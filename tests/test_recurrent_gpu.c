/*
 * test_recurrent_gpu.c: the CUDA backend of the decode op (fused recurrent gated delta rule
 * update), through the public API on device buffers, against the golden files and the CPU
 * backend (same API, host copies of the same inputs; the CPU side is test_recurrent_cpu.c).
 * Checked: the three decode_*.safetensors files: o, the cache and the snapshots within
 * atol = rtol = 1e-3 (bf16 o: plus one bf16 ulp), unnamed slots and their snapshot rows
 * bitwise unchanged, -1 rows exactly 0; random shapes covering every kernel instance (K
 * 16..256, vector and scalar columns, fp32/bf16/fp16 states, dense and cache modes, g and
 * beta absent, L2 norm on/off) vs the CPU at 1e-3 (1e-4 with fp32 inputs and state) plus one
 * ulp of a 16-bit output; graph replay with new data and a new padding pattern == eager;
 * determinism; the decode kernels regs and head bitwise equal to smem on every random case,
 * rows (recurrent_rows.cuh, the default from 256 (request, head) pairs; its compiled-in
 * K = 128 bf16 shapes for M = 1, 2, 3 among the cases) within the same bar and deterministic,
 * and under rows the graph and the S-token checks below too; S tokens in one call == S one-token calls bitwise (o, every snapshot,
 * the final fp32 cache); the fused decode end (decode op + grouped gated RMSNorm in one
 * launch, src/decode_core.h) bitwise equal to the two ops, whether it fused asserted, graph
 * replays (the arrival counters reset between them); GDP_DECODE_END: fused fuses whatever
 * fits, split never fuses (same bits), auto (unset, empty, "auto") never fuses (measured slower), an
 * unknown value is INVALID_USAGE and writes nothing.
 * Device helpers: test_gpu.h. Without a CUDA build or a visible GPU it prints why and exits
 * 77 (skip).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode_core.h"
#include "internal.h" /* defines: gdp_tensor_get/set, gdp_tensor_stride */
#include "kernels/gdp_kernels.h" /* gdp_cuda_decode_mma_calls, gdp_cuda_decode_ring_calls */
#include "test_gpu.h"

#ifdef GDP_HAVE_CUDA

/* Everything one decode call takes (host or device views). */
typedef struct dec_io {
    gdp_recurrent_args a;
} dec_io;

#define DEC_TENSORS 11
static gdp_tensor *dec_slot(gdp_recurrent_args *a, int i) {
    gdp_tensor *all[DEC_TENSORS] = {&a->q,     &a->k,     &a->v,     &a->g,   &a->beta,          &a->initial_state,
                                    &a->state, &a->state_indices, &a->intermediate_states, &a->o, &a->final_state};
    return all[i];
}
/* Outputs among the slots above (o and final_state are poisoned on the device). */
static bool dec_is_output(int i) { return i >= 9; }

static gdp_recurrent_args dec_to_device(const gdp_recurrent_args *h) {
    gdp_recurrent_args d = *h;
    for (int i = 0; i < DEC_TENSORS; i++) {
        gdp_tensor *src = dec_slot((gdp_recurrent_args *)h, i);
        *dec_slot(&d, i) = gdp_tensor_present(src) && dec_is_output(i) ? test_dev_poisoned(src) : test_dev_clone(src);
    }
    return d;
}

/* Fetches the tensors the op writes: o, final_state, state, intermediate_states. */
static void dec_fetch(gdp_recurrent_args *h, const gdp_recurrent_args *d) {
    const int written[4] = {6, 8, 9, 10};
    for (int j = 0; j < 4; j++)
        if (gdp_tensor_present(dec_slot(h, written[j])))
            test_dev_fetch(dec_slot(h, written[j]), dec_slot((gdp_recurrent_args *)d, written[j]));
}

static gdp_recurrent_args dec_host_clone(const gdp_recurrent_args *h) {
    gdp_recurrent_args c = *h;
    for (int i = 0; i < DEC_TENSORS; i++)
        *dec_slot(&c, i) = test_host_clone(dec_slot((gdp_recurrent_args *)h, i));
    return c;
}

static void dec_free(gdp_recurrent_args *a, bool device) {
    for (int i = 0; i < DEC_TENSORS; i++)
        device ? test_dev_free(dec_slot(a, i)) : test_host_free(dec_slot(a, i));
}

static int32_t slot_of(const gdp_recurrent_args *a, int64_t b) {
    return gdp_tensor_present(&a->state_indices) ? ((const int32_t *)a->state_indices.data)[b] : (int32_t)b;
}

/* Cache-mode invariants of a GPU result `got` started from `before`: rows of -1 requests
 * exactly 0; slots no request names, and their snapshot rows, bitwise as before. */
static void dec_check_untouched(const char *label, const gdp_recurrent_args *got, const gdp_recurrent_args *before) {
    const int64_t B = got->q.shape[0], T = got->q.shape[1], H = got->q.shape[2], V = got->v.shape[3];
    const int64_t slots = got->state.shape[0];
    int64_t nonzero = 0, changed = 0, inter_changed = 0, padded = 0;
    bool *named = calloc((size_t)slots, 1);
    for (int64_t b = 0; b < B; b++) {
        const int32_t s = slot_of(got, b);
        if (s >= 0) {
            named[s] = true;
            continue;
        }
        padded++;
        for (int64_t i = 0; i < T * H * V; i++)
            nonzero += gdp_tensor_get(&got->o, b * T * H * V + i) != 0.0;
    }
    const size_t slot_bytes = test_span_bytes(&got->state) / (size_t)slots;
    const bool inter = gdp_tensor_present(&got->intermediate_states);
    const size_t inter_bytes = inter ? test_span_bytes(&got->intermediate_states) / (size_t)slots : 0;
    for (int64_t s = 0; s < slots; s++) {
        if (named[s])
            continue;
        changed += memcmp((char *)got->state.data + s * slot_bytes, (char *)before->state.data + s * slot_bytes,
                          slot_bytes) != 0;
        if (inter)
            inter_changed += memcmp((char *)got->intermediate_states.data + s * inter_bytes,
                                    (char *)before->intermediate_states.data + s * inter_bytes, inter_bytes) != 0;
    }
    free(named);
    CHECK(nonzero == 0, "%s: %lld outputs of -1 rows are not exactly 0", label, (long long)nonzero);
    CHECK(changed == 0, "%s: %lld unnamed slots changed", label, (long long)changed);
    CHECK(inter_changed == 0, "%s: snapshot rows of %lld unnamed slots changed", label, (long long)inter_changed);
    printf("  %s: %lld -1 rows exactly 0; unnamed slots%s bitwise unchanged\n", label, (long long)padded,
           inter ? " and their snapshots" : "");
}

static void decode_golden(const char *file) {
    gdp_st_file *f = test_golden_open(file);
    if (f == NULL)
        return;
    gdp_recurrent_args h = {0};
    gdp_tensor o_ref, state_ref, inter_ref;
    const int32_t M = (int32_t)test_st_meta_num(f, "num_householder", 0);
    const int64_t S = (int64_t)test_st_meta_num(f, "tokens_per_request", 0);
    h.scale = test_st_meta_num(f, "scale", 0);
    h.use_qk_l2norm_in_kernel = (int32_t)test_st_meta_num(f, "use_qk_l2norm_in_kernel", 0);
    h.steps_per_token = M;
    const bool ok = test_st_tensor(f, "q", &h.q) && test_st_tensor(f, "k", &h.k) && test_st_tensor(f, "v", &h.v) &&
                    test_st_tensor(f, "g", &h.g) && test_st_tensor(f, "beta", &h.beta) &&
                    test_st_tensor(f, "state", &h.state) && test_st_tensor(f, "state_indices", &h.state_indices) &&
                    test_st_tensor(f, "o_ref", &o_ref) && test_st_tensor(f, "state_after_ref", &state_ref) &&
                    test_st_tensor(f, "intermediate_states_ref", &inter_ref);
    gdp_st_close(f);
    if (!ok)
        return;
    CHECK(M >= 1 && S >= 1 && h.q.shape[1] == S * M, "%s: metadata M=%d S=%lld vs q steps %lld", file, M,
          (long long)S, (long long)h.q.shape[1]);
    h.intermediate_states = test_tensor_alloc(GDP_DTYPE_FP32, inter_ref.ndim, inter_ref.shape); /* zero-filled */
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: fp32 o (atol = rtol = 1e-3); pass 1: bf16 o (plus one bf16 ulp). */
        const gdp_dtype_t odt = pass == 0 ? GDP_DTYPE_FP32 : GDP_DTYPE_BF16;
        gdp_recurrent_args run = h;
        run.o = test_tensor_alloc(odt, 4, o_ref.shape);
        gdp_recurrent_args before = dec_host_clone(&run);
        gdp_recurrent_args d = dec_to_device(&run);
        CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &d));
        gdp_recurrent_args got = dec_host_clone(&run);
        dec_fetch(&got, &d);
        char what[160];
        printf("%s (M=%d, S=%lld, %s o):\n", file, M, (long long)S, gdp_dtype_name(odt));
        snprintf(what, sizeof what, "%s o (%s)", file, gdp_dtype_name(odt));
        test_compare_bar(what, &got.o, &o_ref, 1e-3, 1e-3, odt);
        snprintf(what, sizeof what, "%s state after", file);
        test_compare_bar(what, &got.state, &state_ref, 1e-3, 1e-3, GDP_DTYPE_FP32);
        snprintf(what, sizeof what, "%s intermediate_states", file);
        test_compare_bar(what, &got.intermediate_states, &inter_ref, 1e-3, 1e-3, GDP_DTYPE_FP32);
        dec_check_untouched(file, &got, &before);
        dec_free(&d, true);
        dec_free(&got, false);    /* clones: owns every buffer */
        dec_free(&before, false); /* likewise */
        test_host_free(&run.o);        /* the rest of run is h's */
    }
    dec_free(&h, false);
    test_host_free(&o_ref);
    test_host_free(&state_ref);
    test_host_free(&inter_ref);
}

typedef struct dec_cfg {
    int64_t B, S, M, H, K, V, slots;
    gdp_dtype_t in_dt, state_dt, o_dt;
    bool has_g, has_beta, l2norm;
    bool cache, identity, inter; /* cache mode: indices absent (identity), snapshots */
    bool dense_init, final;      /* dense mode: initial_state given (state_dt), output_final_state */
    bool gdp_pattern;            /* q only on copy M-1, g only on copy 0 */
    double scale;
    int pad_every; /* every pad_every-th request is -1 (0: none) */
} dec_cfg;

static gdp_recurrent_args dec_random(test_rng *r, const dec_cfg *c) {
    gdp_recurrent_args a = {.scale = c->scale, .use_qk_l2norm_in_kernel = c->l2norm,
                            .steps_per_token = (int32_t)c->M, .output_final_state = c->final};
    const int64_t T = c->S * c->M;
    const int64_t qs[4] = {c->B, T, c->H, c->K}, vs[4] = {c->B, T, c->H, c->V}, gs[3] = {c->B, T, c->H};
    a.q = test_tensor_alloc(c->in_dt, 4, qs);
    a.k = test_tensor_alloc(c->in_dt, 4, qs);
    a.v = test_tensor_alloc(c->in_dt, 4, vs);
    /* Without the in-kernel norm, keys of norm about 1 keep the recurrence contractive. */
    const double qk_scale = c->l2norm ? 1.0 : 1.0 / sqrt((double)c->K);
    test_fill_normal(&a.q, r, qk_scale);
    test_fill_normal(&a.k, r, qk_scale);
    test_fill_normal(&a.v, r, 1.0);
    if (c->has_g) {
        a.g = test_tensor_alloc(GDP_DTYPE_FP32, 3, gs);
        test_fill_uniform(&a.g, r, -1.0, 0.0);
    }
    if (c->has_beta) {
        a.beta = test_tensor_alloc(c->in_dt, 3, gs);
        test_fill_uniform(&a.beta, r, 0.0, 1.0);
    }
    if (c->gdp_pattern) {
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t h = 0; h < c->H; h++) {
                    const int64_t row = (b * T + t) * c->H + h, m = t % c->M;
                    if (m != c->M - 1)
                        for (int64_t i = 0; i < c->K; i++)
                            gdp_tensor_set(&a.q, row * c->K + i, 0.0);
                    if (m != 0 && c->has_g)
                        gdp_tensor_set(&a.g, row, 0.0);
                }
    }
    a.o = test_tensor_alloc(c->o_dt, 4, vs);
    const int64_t bhkv[4] = {c->B, c->H, c->K, c->V};
    if (c->cache) {
        const int64_t ss[4] = {c->slots, c->H, c->K, c->V};
        a.state = test_tensor_alloc(c->state_dt, 4, ss);
        test_fill_uniform(&a.state, r, -1.0, 1.0);
        if (!c->identity) {
            /* Distinct slots from a shuffled pool, with -1 padding every pad_every rows. */
            int32_t *pool = malloc(sizeof(int32_t) * (size_t)c->slots), *idx = malloc(sizeof(int32_t) * (size_t)c->B);
            for (int64_t s = 0; s < c->slots; s++)
                pool[s] = (int32_t)s;
            for (int64_t s = c->slots - 1; s > 0; s--) {
                const int64_t j = (int64_t)(test_uniform(r) * (double)(s + 1));
                const int32_t t = pool[s];
                pool[s] = pool[j];
                pool[j] = t;
            }
            for (int64_t b = 0; b < c->B; b++)
                idx[b] = c->pad_every > 0 && b % c->pad_every == c->pad_every - 1 ? -1 : pool[b];
            a.state_indices = test_int_tensor(idx, c->B);
            free(pool);
            free(idx);
        }
        if (c->inter) {
            const int64_t is[5] = {c->slots, c->S, c->H, c->K, c->V};
            a.intermediate_states = test_tensor_alloc(c->state_dt, 5, is);
            test_fill_value(&a.intermediate_states, 7.0); /* rows nobody writes must keep this */
        }
    } else {
        if (c->dense_init) {
            a.initial_state = test_tensor_alloc(c->state_dt, 4, bhkv);
            test_fill_uniform(&a.initial_state, r, -1.0, 1.0);
        }
        if (c->final)
            a.final_state = test_tensor_alloc(GDP_DTYPE_FP32, 4, bhkv);
    }
    return a;
}

static void decode_vs_cpu(test_rng *r, const dec_cfg *c) {
    char label[200];
    snprintf(label, sizeof label,
             "decode B=%lld S=%lld M=%lld H=%lld K=%lld V=%lld in %s state %s o %s %s%s%s%s%s",
             (long long)c->B, (long long)c->S, (long long)c->M, (long long)c->H, (long long)c->K, (long long)c->V,
             gdp_dtype_name(c->in_dt), gdp_dtype_name(c->state_dt), gdp_dtype_name(c->o_dt),
             c->cache ? (c->identity ? "cache(identity)" : "cache") : (c->dense_init ? "dense(init)" : "dense"),
             c->l2norm ? " l2" : "", c->has_g ? "" : " no-g", c->has_beta ? "" : " no-beta",
             c->inter ? " snapshots" : "");
    gdp_recurrent_args h = dec_random(r, c);
    gdp_recurrent_args before = dec_host_clone(&h);
    gdp_recurrent_args d = dec_to_device(&h);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_cpu, &h));
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &d));
    gdp_recurrent_args got = dec_host_clone(&before);
    dec_fetch(&got, &d);

    const bool fp32 = c->in_dt == GDP_DTYPE_FP32 && c->state_dt == GDP_DTYPE_FP32;
    const double tol = fp32 ? 1e-4 : 1e-3;
    printf("%s (bar %.0e):\n", label, tol);
    const int before_failures = g_test_failures;
    test_compare_bar("o vs CPU", &got.o, &h.o, tol, tol, c->o_dt);
    if (c->cache) {
        test_compare_bar("state vs CPU", &got.state, &h.state, tol, tol, c->state_dt);
        if (c->inter)
            test_compare_bar("intermediate_states vs CPU", &got.intermediate_states, &h.intermediate_states, tol, tol,
                        c->state_dt);
        dec_check_untouched(label, &got, &before);
    } else if (c->final) {
        test_compare_bar("final_state vs CPU", &got.final_state, &h.final_state, tol, tol, GDP_DTYPE_FP32);
    }

    /* Determinism: the same inputs (state restored) give the same bits. */
    if (c->cache)
        test_dev_put(&d.state, &before.state);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &d));
    gdp_recurrent_args again = dec_host_clone(&before);
    dec_fetch(&again, &d);
    test_same_bytes("decode determinism: o", &again.o, &got.o);
    if (c->cache)
        test_same_bytes("decode determinism: state", &again.state, &got.state);
    if (c->final && !c->cache)
        test_same_bytes("decode determinism: final_state", &again.final_state, &got.final_state);

    /* Every decode kernel from the same inputs. GDP_DECODE_STATE=regs | smem | head (the
     * register kernel, the shared-memory one with a block per 32 value columns, or with a
     * block per (request, head); the last two for 16-byte columns) run the same arithmetic:
     * regs and head give smem's bits. rows (recurrent_rows.cuh: one reduction round a
     * token, a closed form of the M steps) rounds differently: the CPU's bar, and its own
     * bits again on a second run. A kernel that does not hold the shape runs the default. */
    /* rows64, rows32 and rows16 (GDP_DECODE_ROWS_COLS: 64-, 32- or 16-column slices where V
     * and K allow them; a shape that does not runs the default slice) sum in other orders
     * again: the CPU's bar, then their own bits on a second run. So do mma and mma16
     * (recurrent_mma.cuh: the products on the tensor cores, in tf32 halves; its own slice, and
     * 16 columns a block), where they hold the shape (bf16 q, k, v; K 64 or 128), and ring and
     * ring32 (recurrent_ring.cuh: one column a thread, sums over K in-thread; its own slice, and 32
     * columns a group), and both with the K rows split over two threads a column (/k2). */
    static const struct {
        const char *name, *state, *cols;
        bool first;         /* the reference of the runs after it: held to the CPU bar */
        const char *ksplit; /* GDP_DECODE_RING_KSPLIT */
    } kernels[] = {{"smem", "smem", NULL, true, NULL},    {"regs", "regs", NULL, false, NULL},  {"head", "head", NULL, false, NULL},
                   {"rows", "rows", "128", true, NULL},   {"rows", "rows", "128", false, NULL}, {"rows64", "rows", "64", true, NULL},
                   {"rows64", "rows", "64", false, NULL}, {"rows32", "rows", "32", true, NULL},  {"rows32", "rows", "32", false, NULL},
                   {"rows16", "rows", "16", true, NULL},  {"rows16", "rows", "16", false, NULL}, {"mma", "mma", NULL, true, NULL},
                   {"mma", "mma", NULL, false, NULL},     {"mma16", "mma", "16", true, NULL},   {"mma16", "mma", "16", false, NULL},
                   {"ring", "ring", NULL, true, NULL},    {"ring", "ring", NULL, false, NULL},  {"ring32", "ring", "32", true, NULL},
                   {"ring32", "ring", "32", false, NULL}, {"ring/k2", "ring", NULL, true, "2"},
                   {"ring/k2", "ring", NULL, false, "2"}, {"ring32/k2", "ring", "32", true, "2"},
                   {"ring32/k2", "ring", "32", false, "2"}};
    gdp_recurrent_args base = {0};
    for (int kk = 0; kk < (int)(sizeof kernels / sizeof kernels[0]); kk++) {
        char *saved = test_env_swap("GDP_DECODE_STATE", kernels[kk].state);
        char *saved_cols = test_env_swap("GDP_DECODE_ROWS_COLS", kernels[kk].cols);
        char *saved_split = test_env_swap("GDP_DECODE_RING_KSPLIT", kernels[kk].ksplit);
        if (c->cache)
            test_dev_put(&d.state, &before.state);
        CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &d));
        test_env_restore("GDP_DECODE_RING_KSPLIT", saved_split);
        test_env_restore("GDP_DECODE_ROWS_COLS", saved_cols);
        test_env_restore("GDP_DECODE_STATE", saved);
        gdp_recurrent_args other = dec_host_clone(&before);
        dec_fetch(&other, &d);
        if (kernels[kk].first) { /* smem and the first run of each row slice: what the next ones must equal */
            if (kk > 0) {
                char what[64];
                snprintf(what, sizeof what, "decode kernel %s: o vs CPU", kernels[kk].name);
                test_compare_bar(what, &other.o, &h.o, tol, tol, c->o_dt);
                snprintf(what, sizeof what, "decode kernel %s: state vs CPU", kernels[kk].name);
                if (c->cache)
                    test_compare_bar(what, &other.state, &h.state, tol, tol, c->state_dt);
                snprintf(what, sizeof what, "decode kernel %s: snapshots vs CPU", kernels[kk].name);
                if (c->cache && c->inter)
                    test_compare_bar(what, &other.intermediate_states, &h.intermediate_states, tol, tol, c->state_dt);
                snprintf(what, sizeof what, "decode kernel %s: final_state vs CPU", kernels[kk].name);
                if (c->final && !c->cache)
                    test_compare_bar(what, &other.final_state, &h.final_state, tol, tol, GDP_DTYPE_FP32);
                dec_free(&base, false);
            }
            base = other;
            continue;
        }
        char what[64];
        snprintf(what, sizeof what, "decode kernel %s: o", kernels[kk].name);
        test_same_bytes(what, &other.o, &base.o);
        if (c->cache) {
            snprintf(what, sizeof what, "decode kernel %s: state", kernels[kk].name);
            test_same_bytes(what, &other.state, &base.state);
            if (c->inter) {
                snprintf(what, sizeof what, "decode kernel %s: snapshots", kernels[kk].name);
                test_same_bytes(what, &other.intermediate_states, &base.intermediate_states);
            }
        }
        if (c->final && !c->cache) {
            snprintf(what, sizeof what, "decode kernel %s: final_state", kernels[kk].name);
            test_same_bytes(what, &other.final_state, &base.final_state);
        }
        dec_free(&other, false);
    }
    dec_free(&base, false);
    printf("  %s\n", g_test_failures == before_failures
                          ? "ok (a second run bitwise equal; regs, head = smem bitwise; rows, rows64, rows32 and "
                            "rows16 within the bar, each twice the same bits)"
                          : "FAILED");
    dec_free(&again, false);
    dec_free(&got, false);
    dec_free(&d, true);
    dec_free(&before, false);
    dec_free(&h, false);
}

static gdp_status_t dec_graph_fn(void *p) { return gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, p); }

/* Capture once; replay with new q/k/v/g/beta, a new cache and a new padding pattern:
 * each replay bitwise equals an eager run from the same inputs. */
static void decode_graph(test_rng *r, const dec_cfg *c) {
    gdp_recurrent_args h = dec_random(r, c);
    gdp_recurrent_args d = dec_to_device(&h);
    cudaGraphExec_t exec = test_graph_capture(dec_graph_fn, &d);
    int rounds_ok = 0;
    for (int round = 0; round < 2; round++) {
        dec_cfg c2 = *c;
        c2.pad_every = round == 0 ? 2 : 5; /* a different padding count each time */
        gdp_recurrent_args fresh = dec_random(r, &c2);
        for (int i = 0; i < 9; i++)
            if (gdp_tensor_present(dec_slot(&fresh, i)))
                test_dev_put(dec_slot(&d, i), dec_slot(&fresh, i));
        CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &d));
        gdp_recurrent_args eager = dec_host_clone(&fresh);
        dec_fetch(&eager, &d);
        /* Back to the fresh inputs (the eager call updated the cache in place). */
        for (int i = 0; i < 9; i++)
            if (gdp_tensor_present(dec_slot(&fresh, i)))
                test_dev_put(dec_slot(&d, i), dec_slot(&fresh, i));
        CUDA_OK(cudaMemset(d.o.data, TEST_SENTINEL_BYTE, test_span_bytes(&d.o)));
        test_graph_replay(exec);
        gdp_recurrent_args replayed = dec_host_clone(&fresh);
        dec_fetch(&replayed, &d);
        const int before = g_test_failures;
        test_same_bytes("decode graph replay vs eager: o", &replayed.o, &eager.o);
        test_same_bytes("decode graph replay vs eager: state", &replayed.state, &eager.state);
        if (c->inter)
            test_same_bytes("decode graph replay vs eager: snapshots", &replayed.intermediate_states,
                       &eager.intermediate_states);
        rounds_ok += g_test_failures == before;
        dec_free(&replayed, false);
        dec_free(&eager, false);
        dec_free(&fresh, false);
    }
    printf("decode graph (B=%lld S=%lld M=%lld H=%lld K=%lld V=%lld): %d of 2 replays with new inputs and padding "
           "bitwise equal to eager runs\n",
           (long long)c->B, (long long)c->S, (long long)c->M, (long long)c->H, (long long)c->K, (long long)c->V,
           rounds_ok);
    if (exec != NULL)
        CUDA_OK(cudaGraphExecDestroy(exec));
    dec_free(&d, true);
    dec_free(&h, false);
}

/* Steps [t0, t0 + n) of a contiguous host tensor [B, T, ...] as a new tensor [B, n, ...]. */
static gdp_tensor slice_steps(const gdp_tensor *src, int64_t t0, int64_t n) {
    if (!gdp_tensor_present(src))
        return *src;
    int64_t shape[GDP_MAX_DIMS];
    for (int32_t d = 0; d < src->ndim; d++)
        shape[d] = src->shape[d];
    shape[1] = n;
    gdp_tensor out = test_tensor_alloc(src->dtype, src->ndim, shape);
    const size_t row = gdp_dtype_size(src->dtype) * (size_t)(gdp_tensor_numel(src) / (src->shape[0] * src->shape[1]));
    for (int64_t b = 0; b < src->shape[0]; b++)
        memcpy((char *)out.data + (size_t)(b * n) * row, (const char *)src->data + (size_t)(b * src->shape[1] + t0) * row,
               (size_t)n * row);
    return out;
}

/* One call of S tokens (with snapshots) against S calls of one token from the same cache, on
 * the GPU with an fp32 cache (the state stays fp32 between tokens either way): o, the final
 * state and every snapshot bitwise equal to the token-by-token run (gdp-math.md 5.3). */
static void decode_tokens_vs_single(test_rng *r, const dec_cfg *c) {
    gdp_recurrent_args h = dec_random(r, c);
    const int64_t B = c->B, S = c->S, M = c->M, slots = c->slots;
    gdp_recurrent_args d = dec_to_device(&h);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &d));
    gdp_recurrent_args all = dec_host_clone(&h);
    dec_fetch(&all, &d);
    dec_free(&d, true);

    /* Token by token from the same starting cache. */
    gdp_tensor state_dev = test_dev_clone(&h.state);
    gdp_tensor idx_dev = test_dev_clone(&h.state_indices);
    const size_t slot_bytes = test_span_bytes(&h.state) / (size_t)slots;
    const size_t inter_row = slot_bytes; /* one [H, K, V] block of the snapshots */
    int64_t o_diff = 0, snap_diff = 0;
    gdp_tensor state_now = test_host_clone(&h.state);
    for (int64_t s = 0; s < S; s++) {
        gdp_recurrent_args one = {.scale = h.scale, .use_qk_l2norm_in_kernel = h.use_qk_l2norm_in_kernel,
                                  .steps_per_token = h.steps_per_token};
        gdp_tensor q = slice_steps(&h.q, s * M, M), k = slice_steps(&h.k, s * M, M), v = slice_steps(&h.v, s * M, M);
        gdp_tensor g = slice_steps(&h.g, s * M, M), beta = slice_steps(&h.beta, s * M, M);
        gdp_tensor o = slice_steps(&h.o, s * M, M);
        one.q = test_dev_clone(&q), one.k = test_dev_clone(&k), one.v = test_dev_clone(&v);
        one.g = test_dev_clone(&g), one.beta = test_dev_clone(&beta);
        one.o = test_dev_poisoned(&o);
        one.state = state_dev;
        one.state_indices = idx_dev;
        CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &one));
        test_dev_fetch(&o, &one.o);
        test_dev_fetch(&state_now, &state_dev);
        /* o of token s in the S-token call. */
        gdp_tensor o_all_s = slice_steps(&all.o, s * M, M);
        o_diff += memcmp(o.data, o_all_s.data, test_span_bytes(&o)) != 0;
        /* Snapshot [slot, s] of every named slot == the slot after the s-th single call. */
        for (int64_t b = 0; b < B; b++) {
            const int32_t slot = slot_of(&h, b);
            if (slot < 0)
                continue;
            snap_diff += memcmp((char *)all.intermediate_states.data + (size_t)(slot * S + s) * inter_row,
                                (char *)state_now.data + (size_t)slot * slot_bytes, slot_bytes) != 0;
        }
        test_host_free(&o_all_s);
        test_dev_free(&one.q), test_dev_free(&one.k), test_dev_free(&one.v), test_dev_free(&one.g), test_dev_free(&one.beta);
        test_dev_free(&one.o);
        test_host_free(&q), test_host_free(&k), test_host_free(&v), test_host_free(&o);
        test_host_free(&g), test_host_free(&beta); /* absent ones hold NULL */
    }
    CHECK(o_diff == 0, "decode %lld tokens in one call vs one at a time: o of %lld tokens not bitwise equal",
          (long long)S, (long long)o_diff);
    CHECK(snap_diff == 0, "decode %lld tokens in one call vs one at a time: %lld snapshots not bitwise equal",
          (long long)S, (long long)snap_diff);
    test_same_bytes("decode S tokens in one call vs one at a time: final cache", &all.state, &state_now);
    printf("decode B=%lld S=%lld M=%lld H=%lld K=%lld V=%lld (%s cache): one call of %lld tokens == %lld one-token "
           "calls bitwise (o, every snapshot, the final cache)\n",
           (long long)B, (long long)S, (long long)M, (long long)c->H, (long long)c->K, (long long)c->V,
           gdp_dtype_name(c->state_dt), (long long)S, (long long)S);
    test_dev_free(&state_dev);
    test_dev_free(&idx_dev);
    test_host_free(&state_now);
    dec_free(&all, false);
    dec_free(&h, false);
}

/* The fused decode end (gdp_decode_recurrent_norm, src/decode_core.h) against the chain it
 * replaces, the decode op then the grouped gated RMSNorm of its last Householder copies, on
 * the GPU from the same inputs: o, the cache and the norm's output bit for bit; whether the
 * one launch ran is asserted (expect_fused), under GDP_DECODE_END=end (NULL: unset, i.e.
 * auto) and GDP_DECODE_STATE=kernel (NULL: as the environment has it). z is a row view of a
 * wider buffer, as in the layer. Then the fused call captured in a graph and replayed twice
 * with a fresh cache: both replays equal the eager call (the second one shows the arrival
 * counters reset). */
typedef struct end_call {
    gdp_recurrent_args rec;
    gdp_tensor out, y, z, w;
    int64_t group;
} end_call;
static gdp_status_t end_graph_fn(void *p) {
    end_call *c = p;
    return gdp_decode_recurrent_norm(g_test_gpu, &c->rec, &c->out, &c->y, &c->z, &c->w, c->group, 1e-5);
}

static gdp_tensor last_copy_view(const gdp_recurrent_args *d, int64_t B, int64_t M, int64_t H, int64_t V) {
    const size_t es = gdp_dtype_size(d->o.dtype);
    return (gdp_tensor){.data = (char *)d->o.data + (size_t)((M - 1) * H * V) * es, .dtype = d->o.dtype, .ndim = 2,
                        .shape = {B, H * V}, .stride = {M * H * V, 1}};
}

static void decode_end_vs_chain(test_rng *r, const dec_cfg *c, int64_t hpg, bool expect_fused, const char *kernel,
                                const char *end) {
    const int64_t B = c->B, M = c->M, H = c->H, V = c->V, d = H * V, n = hpg * V, pitch = d + 16;
    gdp_recurrent_args h = dec_random(r, c);
    const int64_t z_shape[1] = {B * pitch}, w_shape[1] = {d}, out_shape[2] = {B, d};
    gdp_tensor zh = test_tensor_alloc(c->o_dt, 1, z_shape), wh = test_tensor_alloc(c->o_dt, 1, w_shape);
    gdp_tensor outh = test_tensor_alloc(c->o_dt, 2, out_shape);
    test_fill_normal(&zh, r, 1.0), test_fill_normal(&wh, r, 0.5);
    gdp_tensor zd = test_dev_clone(&zh), wd = test_dev_clone(&wh);
    const gdp_tensor z = {.data = zd.data, .dtype = c->o_dt, .ndim = 2, .shape = {B, d}, .stride = {pitch, 1}};
    const gdp_tensor w = {.data = wd.data, .dtype = c->o_dt, .ndim = 1, .shape = {d}, .stride = {1}};
    char *saved_kernel = kernel != NULL ? test_env_swap("GDP_DECODE_STATE", kernel) : NULL;
    char *saved_end = test_env_swap("GDP_DECODE_END", end);

    gdp_recurrent_args d1 = dec_to_device(&h), d2 = dec_to_device(&h);
    gdp_tensor out1 = test_dev_poisoned(&outh), out2 = test_dev_poisoned(&outh);
    gdp_tensor y1 = last_copy_view(&d1, B, M, H, V), y2 = last_copy_view(&d2, B, M, H, V);
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &d1));
    CHECK_OK(gdp_gated_rmsnorm(g_test_gpu, &out1, &y1, &z, &w, n, 1e-5));
    bool fused = false;
    CHECK_OK(gdp_decode_recurrent_norm_ex(g_test_gpu, &d2, &out2, &y2, &z, &w, n, 1e-5, &fused));
    CHECK(fused == expect_fused,
          "decode end (B %lld, H %lld, group of %lld heads, V %lld, GDP_DECODE_END %s): fused %d, expected %d",
          (long long)B, (long long)H, (long long)hpg, (long long)V, end ? end : "unset", (int)fused,
          (int)expect_fused);
    gdp_recurrent_args g1 = dec_host_clone(&h), g2 = dec_host_clone(&h);
    dec_fetch(&g1, &d1);
    dec_fetch(&g2, &d2);
    gdp_tensor o1 = test_host_clone(&outh), o2 = test_host_clone(&outh);
    test_dev_fetch(&o1, &out1);
    test_dev_fetch(&o2, &out2);
    const int before = g_test_failures;
    test_same_bytes("decode end fused vs chain: o", &g2.o, &g1.o);
    if (c->cache)
        test_same_bytes("decode end fused vs chain: state", &g2.state, &g1.state);
    test_same_bytes("decode end fused vs chain: norm out", &o2, &o1);

    /* graph: the fused call replayed twice from a fresh cache, each == the eager call */
    int replays_ok = 0;
    if (expect_fused) {
        end_call call = {.rec = d2, .out = out2, .y = y2, .z = z, .w = w, .group = n};
        cudaGraphExec_t exec = test_graph_capture(end_graph_fn, &call);
        for (int round = 0; round < 2; round++) {
            if (c->cache)
                test_dev_put(&d2.state, &h.state);
            CUDA_OK(cudaMemset(out2.data, TEST_SENTINEL_BYTE, test_span_bytes(&out2)));
            test_graph_replay(exec);
            gdp_tensor o3 = test_host_clone(&outh);
            test_dev_fetch(&o3, &out2);
            const int b0 = g_test_failures;
            test_same_bytes("decode end graph replay vs eager: norm out", &o3, &o1);
            replays_ok += g_test_failures == b0;
            test_host_free(&o3);
        }
        if (exec != NULL)
            CUDA_OK(cudaGraphExecDestroy(exec));
    }
    printf("decode end fused vs chain (B %lld, S %lld, M %lld, H %lld, heads per norm group %lld, K %lld, V %lld, "
           "state %s%s, GDP_DECODE_STATE %s, GDP_DECODE_END %s): %s; fused %s; graph replays %d of %d\n",
           (long long)B, (long long)c->S, (long long)M, (long long)H, (long long)hpg, (long long)c->K, (long long)V,
           gdp_dtype_name(c->state_dt), c->pad_every ? ", -1 rows" : "", kernel ? kernel : "default",
           end == NULL ? "unset" : end[0] == '\0' ? "empty" : end,
           g_test_failures == before ? "bitwise equal" : "DIFFERENT", fused ? "yes" : "no (two ops)", replays_ok,
           expect_fused ? 2 : 0);
    test_env_restore("GDP_DECODE_END", saved_end);
    if (kernel != NULL)
        test_env_restore("GDP_DECODE_STATE", saved_kernel);
    dec_free(&g1, false), dec_free(&g2, false);
    dec_free(&d1, true), dec_free(&d2, true);
    test_dev_free(&out1), test_dev_free(&out2), test_dev_free(&zd), test_dev_free(&wd);
    test_host_free(&o1), test_host_free(&o2), test_host_free(&zh), test_host_free(&wh), test_host_free(&outh);
    dec_free(&h, false);
}

/* GDP_DECODE_END=sometimes: both entry points return INVALID_USAGE naming the variable and
 * the value, *fused stays false, and o, the cache and the norm output keep their bytes. */
/* A decode switch with an unknown value (GDP_DECODE_STATE=fastest, GDP_DECODE_ROWS_COLS=96,
 * GDP_DECODE_RING_KSPLIT=3): the
 * plain op is refused with INVALID_USAGE naming the variable, the value and an accepted one, and
 * writes nothing (o and the state keep their bytes). */
static void decode_env_bad_value(test_rng *r, const dec_cfg *c, const char *var, const char *value,
                                 const char *accepted) {
    gdp_recurrent_args h = dec_random(r, c);
    gdp_recurrent_args dv = dec_to_device(&h);
    gdp_recurrent_args was = dec_host_clone(&h), now = dec_host_clone(&h);
    dec_fetch(&was, &dv);
    const int before = g_test_failures;
    char *saved = test_env_swap(var, value);
    const gdp_status_t st = gdp_fused_recurrent_gated_delta_rule_update(g_test_gpu, &dv);
    const char *msg = gdp_last_error();
    CHECK(st == GDP_STATUS_INVALID_USAGE, "decode under %s=%s: status %d (%s), expected INVALID_USAGE", var, value,
          (int)st, gdp_status_string(st));
    CHECK(msg != NULL && strstr(msg, var) != NULL && strstr(msg, value) != NULL && strstr(msg, accepted) != NULL,
          "the message names the variable, the value and the accepted values: %s", msg ? msg : "(null)");
    test_env_restore(var, saved);
    dec_fetch(&now, &dv);
    char what[96];
    snprintf(what, sizeof what, "%s refused: o unchanged", var);
    test_same_bytes(what, &now.o, &was.o);
    snprintf(what, sizeof what, "%s refused: state unchanged", var);
    if (c->cache)
        test_same_bytes(what, &now.state, &was.state);
    printf("decode %s=%s: %s\n", var, value, g_test_failures == before ? "INVALID_USAGE, nothing written" : "FAILED");
    dec_free(&was, false), dec_free(&now, false), dec_free(&dv, true), dec_free(&h, false);
}

static void decode_end_bad_value(test_rng *r, const dec_cfg *c, int64_t hpg) {
    const int64_t B = c->B, M = c->M, H = c->H, V = c->V, d = H * V, n = hpg * V;
    gdp_recurrent_args h = dec_random(r, c);
    const int64_t w_shape[1] = {d}, zo_shape[2] = {B, d};
    gdp_tensor zh = test_tensor_alloc(c->o_dt, 2, zo_shape), wh = test_tensor_alloc(c->o_dt, 1, w_shape);
    gdp_tensor outh = test_tensor_alloc(c->o_dt, 2, zo_shape);
    test_fill_normal(&zh, r, 1.0), test_fill_normal(&wh, r, 0.5);
    gdp_tensor z = test_dev_clone(&zh), w = test_dev_clone(&wh), out = test_dev_poisoned(&outh);
    gdp_recurrent_args dv = dec_to_device(&h);
    gdp_tensor y = last_copy_view(&dv, B, M, H, V);
    gdp_recurrent_args was = dec_host_clone(&h), now = dec_host_clone(&h);
    gdp_tensor out_was = test_host_clone(&outh), out_now = test_host_clone(&outh);
    dec_fetch(&was, &dv);
    test_dev_fetch(&out_was, &out);

    const int before = g_test_failures;
    char *saved = test_env_swap("GDP_DECODE_END", "sometimes");
    bool fused = true;
    const gdp_status_t st = gdp_decode_recurrent_norm_ex(g_test_gpu, &dv, &out, &y, &z, &w, n, 1e-5, &fused);
    const char *msg = gdp_last_error();
    CHECK(st == GDP_STATUS_INVALID_USAGE && !fused,
          "decode end under GDP_DECODE_END=sometimes: status %d (%s), fused %d; expected INVALID_USAGE, not fused",
          (int)st, gdp_status_string(st), (int)fused);
    CHECK(msg != NULL && strstr(msg, "GDP_DECODE_END") != NULL && strstr(msg, "sometimes") != NULL &&
              strstr(msg, "split") != NULL,
          "the message names the variable, the value and the accepted values: %s", msg ? msg : "(null)");
    CHECK_STATUS(gdp_decode_recurrent_norm(g_test_gpu, &dv, &out, &y, &z, &w, n, 1e-5), GDP_STATUS_INVALID_USAGE);
    test_env_restore("GDP_DECODE_END", saved);

    dec_fetch(&now, &dv);
    test_dev_fetch(&out_now, &out);
    test_same_bytes("decode end refused: o unchanged", &now.o, &was.o);
    if (c->cache)
        test_same_bytes("decode end refused: state unchanged", &now.state, &was.state);
    test_same_bytes("decode end refused: norm out unchanged", &out_now, &out_was);
    printf("decode end GDP_DECODE_END=sometimes (B %lld): %s\n", (long long)B,
           g_test_failures == before ? "INVALID_USAGE, nothing written" : "FAILED");
    dec_free(&was, false), dec_free(&now, false), dec_free(&dv, true);
    test_dev_free(&z), test_dev_free(&w), test_dev_free(&out);
    test_host_free(&zh), test_host_free(&wh), test_host_free(&outh), test_host_free(&out_was);
    test_host_free(&out_now);
    dec_free(&h, false);
}

/* Whether a case's launches took a kernel that counts its launches (the tensor-core kernel,
 * gdp_cuda_decode_mma_calls; the ring kernel, gdp_cuda_decode_ring_calls) under
 * GDP_DECODE_STATE=kernel (NULL: the default): forced, every case it holds; by default the
 * tensor-core kernel takes a bf16 state from 256 request-head pairs (MMA_MIN_PAIRS_BF16,
 * kernels/recurrent.cu) and no fp32 one. */
static void decode_kernel_ran(test_rng *r, const dec_cfg *c, const char *kernel, long long (*calls)(void),
                              const char *what, bool expect) {
    char *saved = test_env_swap("GDP_DECODE_STATE", kernel);
    const long long before = calls();
    decode_graph(r, c);
    const long long ran = calls() - before;
    test_env_restore("GDP_DECODE_STATE", saved);
    printf("GDP_DECODE_STATE=%s, B %lld H %lld, %s state: the %s ran %lld launches\n", kernel ? kernel : "(unset)",
           (long long)c->B, (long long)c->H, gdp_dtype_name(c->state_dt), what, ran);
    CHECK(expect ? ran > 0 : ran == 0, "GDP_DECODE_STATE=%s, B %lld H %lld, %s state: the %s ran %lld launches, expected %s",
          kernel ? kernel : "(unset)", (long long)c->B, (long long)c->H, gdp_dtype_name(c->state_dt), what, ran,
          expect ? "some" : "none");
}
static void decode_mma_ran(test_rng *r, const dec_cfg *c, const char *kernel, bool expect) {
    decode_kernel_ran(r, c, kernel, gdp_cuda_decode_mma_calls, "tensor-core kernel", expect);
}

static void decode_tests(test_rng *r) {
    const char *files[3] = {"decode_m1_k128.safetensors", "decode_m2_slots_pad.safetensors",
                            "decode_m3_draft3.safetensors"};
    for (int i = 0; i < 3; i++)
        decode_golden(files[i]);
    static const char *const golden_kernels[3] = {"rows", "mma", "ring"};
    for (int kk = 0; kk < 3; kk++) {
        char *saved = test_env_swap("GDP_DECODE_STATE", golden_kernels[kk]);
        printf("GDP_DECODE_STATE=%s:\n", golden_kernels[kk]);
        for (int i = 0; i < 3; i++)
            decode_golden(files[i]);
        test_env_restore("GDP_DECODE_STATE", saved);
    }
    const gdp_dtype_t F32 = GDP_DTYPE_FP32, BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16;
    const dec_cfg cases[] = {
        /* B, S, M, H, K, V, slots, in, state, o, g, beta, l2, cache, identity, inter, init, final, pattern, scale, pad */
        {8, 1, 2, 4, 128, 128, 12, BF, F32, BF, true, true, true, true, false, true, false, false, true, 0, 3},
        {5, 3, 3, 2, 64, 64, 9, BF, BF, F32, true, true, true, true, false, true, false, false, true, 0, 4},
        {4, 4, 1, 3, 32, 32, 4, F32, F32, F32, true, true, false, true, true, false, false, false, false, 0.3, 0},
        {3, 1, 2, 2, 256, 64, 5, F16, F32, F16, true, true, true, true, false, false, false, false, true, 0, 0},
        {2, 2, 1, 2, 256, 128, 3, BF, BF, BF, true, true, true, true, false, true, false, false, false, 0, 0},
        {3, 2, 2, 2, 100, 30, 6, F32, F32, F32, false, false, true, true, false, true, false, false, false, 0, 2},
        {4, 1, 3, 2, 16, 12, 4, BF, BF, F32, true, true, true, true, true, false, false, false, true, 0.5, 0},
        {4, 1, 2, 2, 64, 64, 0, F32, F32, F32, true, true, true, false, false, false, true, true, true, 0, 0},
        {3, 2, 2, 3, 128, 128, 0, BF, F32, F32, true, true, true, false, false, false, false, true, true, 0, 0},
        {2, 1, 2, 2, 64, 64, 0, F16, F16, F32, true, true, true, false, false, false, true, true, false, 0, 0},
        {2, 1, 2, 2, 48, 40, 0, BF, BF, F32, true, false, false, false, false, false, true, false, false, 0, 0},
        {64, 1, 2, 16, 128, 128, 80, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 16},
        {6, 4, 2, 4, 128, 128, 10, BF, F32, BF, true, true, true, true, false, true, false, false, true, 0, 3},
        /* Grids larger than two generations of resident blocks: the L2 prefetch path. */
        {40, 1, 2, 16, 128, 128, 0, BF, F32, F32, true, true, true, false, false, false, true, true, true, 0, 0},
        {48, 1, 2, 16, 128, 128, 56, BF, BF, BF, true, true, true, true, false, false, false, false, true, 0, 7},
        /* The benchmark shapes: H=32, V=64, M=3; many requests of a bf16 cache with drafts. */
        {24, 1, 3, 32, 128, 64, 30, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 5},
        {20, 2, 2, 16, 128, 128, 24, BF, BF, BF, true, true, true, true, false, true, false, false, true, 0, 6},
        /* The row kernel's general paths: a query on every step, no g, beta or norm, K padded
         * inside a 64-column slice; M = 1 with three tokens over two 128-column slices. */
        {4, 2, 2, 3, 100, 64, 6, F32, F32, F32, false, false, false, true, false, true, false, false, false, 0.4, 2},
        {3, 3, 1, 2, 128, 256, 0, BF, F32, F32, true, true, true, false, false, false, true, true, false, 0, 0},
        /* The row kernel's compiled-in shapes (K = 128, bf16 q/k/v and o; M = 1, 2, 3 on 128- and
         * 64-column slices): M = 1 both widths, M = 3 on whole rows with a bf16 cache and drafts. */
        {7, 1, 1, 4, 128, 128, 10, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 2},
        {6, 1, 1, 3, 128, 64, 9, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 2},
        {5, 2, 3, 2, 128, 128, 8, BF, BF, BF, true, true, true, true, false, true, false, false, true, 0, 2},
        /* The tensor-core kernel's general paths: no g, beta or norm on 32 columns (two 16-column
         * slices or one), fp32 o; a dense bf16 initial state with an fp32 final state. */
        {3, 2, 2, 3, 128, 32, 6, BF, F32, F32, false, false, false, true, false, true, false, false, false, 0.4, 2},
        {4, 1, 2, 3, 128, 64, 0, BF, BF, F32, true, true, true, false, false, false, true, true, true, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        decode_vs_cpu(r, &cases[i]);
    decode_graph(r, &cases[0]);
    decode_graph(r, &cases[12]);
    /* S tokens in one call == S one-token calls (fp32 cache, snapshots, -1 rows). */
    const dec_cfg multi[] = {
        {6, 4, 2, 4, 128, 128, 10, BF, F32, BF, true, true, true, true, false, true, false, false, true, 0, 3},
        {5, 3, 3, 2, 128, 64, 8, BF, F32, F32, true, true, true, true, false, true, false, false, true, 0, 4},
    };
    for (size_t i = 0; i < sizeof multi / sizeof multi[0]; i++)
        decode_tokens_vs_single(r, &multi[i]);
    /* Where the tensor-core kernel runs: forced on a case it holds (fp32 cache, drafts); by
     * default on the bf16 cache of 48 x 16 heads, not on the fp32 one of 64 x 16 nor on the bf16
     * one of 5 x 2. */
    decode_mma_ran(r, &cases[12], "mma", true);
    decode_mma_ran(r, &cases[14], NULL, true);
    decode_mma_ran(r, &cases[11], NULL, false);
    decode_mma_ran(r, &cases[21], NULL, false);
    /* The ring kernel runs where forced on a shape it holds (fp32 cache with drafts; a bf16 cache),
     * and not on one it does not (K = 32, fp32 q and k), nor by default. */
    decode_kernel_ran(r, &cases[12], "ring", gdp_cuda_decode_ring_calls, "ring kernel", true);
    decode_kernel_ran(r, &cases[14], "ring", gdp_cuda_decode_ring_calls, "ring kernel", true);
    decode_kernel_ran(r, &cases[2], "ring", gdp_cuda_decode_ring_calls, "ring kernel", false);
    decode_kernel_ran(r, &cases[11], NULL, gdp_cuda_decode_ring_calls, "ring kernel", false);
    /* The same two properties of the row kernel (it holds these shapes), also on 16-column slices
     * (the small-batch tile); of the tensor-core kernel, on its own slice and on 16 columns; of the
     * ring kernel, on its own slice and on 32 columns, each also with the K split. */
    static const struct {
        const char *state, *cols, *ksplit;
    } graph_kernels[] = {{"rows", NULL, NULL}, {"rows", "16", NULL}, {"mma", NULL, NULL}, {"mma", "16", NULL},
                         {"ring", NULL, NULL}, {"ring", "32", NULL}, {"ring", NULL, "2"}, {"ring", "32", "2"}};
    for (int gk = 0; gk < (int)(sizeof graph_kernels / sizeof graph_kernels[0]); gk++) {
        char *saved = test_env_swap("GDP_DECODE_STATE", graph_kernels[gk].state);
        char *saved_cols = test_env_swap("GDP_DECODE_ROWS_COLS", graph_kernels[gk].cols);
        char *saved_split = test_env_swap("GDP_DECODE_RING_KSPLIT", graph_kernels[gk].ksplit);
        printf("GDP_DECODE_STATE=%s%s%s%s%s:\n", graph_kernels[gk].state, graph_kernels[gk].cols ? " GDP_DECODE_ROWS_COLS=" : "",
               graph_kernels[gk].cols ? graph_kernels[gk].cols : "",
               graph_kernels[gk].ksplit ? " GDP_DECODE_RING_KSPLIT=" : "", graph_kernels[gk].ksplit ? graph_kernels[gk].ksplit : "");
        decode_graph(r, &cases[0]);
        decode_graph(r, &cases[12]);
        for (size_t i = 0; i < sizeof multi / sizeof multi[0]; i++)
            decode_tokens_vs_single(r, &multi[i]);
        test_env_restore("GDP_DECODE_RING_KSPLIT", saved_split);
        test_env_restore("GDP_DECODE_ROWS_COLS", saved_cols);
        test_env_restore("GDP_DECODE_STATE", saved);
    }
    /* The fused decode end under GDP_DECODE_END=fused (fuse whatever fits): the layer's
     * shapes (norm groups of 4 heads x 128 = 512, the layer's B=1 and B=64; GQA 2 with V 64
     * and -1 rows; a bf16 cache), a group of one head, and two calls that do not fit (a
     * 1024-element group; two tokens a request) and run the ops. */
    const dec_cfg ends[] = {
        {1, 1, 2, 16, 128, 128, 4, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 0},
        {37, 1, 3, 8, 128, 64, 40, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 3},
        {12, 1, 2, 8, 128, 128, 16, BF, BF, BF, true, true, true, true, false, false, false, false, true, 0, 5},
        {5, 1, 2, 4, 64, 64, 6, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 0},
        {3, 1, 2, 8, 128, 128, 4, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 0},
        {3, 2, 2, 4, 128, 128, 4, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 0},
        {64, 1, 2, 16, 128, 128, 80, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 16},
        {16, 1, 2, 8, 128, 128, 20, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 5},
        {17, 1, 2, 8, 128, 128, 20, BF, F32, BF, true, true, true, true, false, false, false, false, true, 0, 5},
    };
    /* The default op is the row kernel wherever it fits (every batch), whose bits differ from
     * the fused end's shared-memory kernel; the chain under smem, head or regs is the same
     * arithmetic as the fused end. */
    decode_end_vs_chain(r, &ends[0], 4, true, "smem", "fused");
    decode_end_vs_chain(r, &ends[0], 4, true, "regs", "fused");
    decode_end_vs_chain(r, &ends[1], 2, true, "smem", "fused");
    decode_end_vs_chain(r, &ends[1], 2, true, "head", "fused");
    decode_end_vs_chain(r, &ends[2], 4, true, "smem", "fused");
    decode_end_vs_chain(r, &ends[2], 4, true, "head", "fused");
    decode_end_vs_chain(r, &ends[3], 1, true, "smem", "fused");
    decode_end_vs_chain(r, &ends[4], 8, false, NULL, "fused"); /* 8 x 128 = 1024 elements a group */
    decode_end_vs_chain(r, &ends[5], 4, false, NULL, "fused"); /* two tokens a request */
    decode_end_vs_chain(r, &ends[6], 4, true, "smem", "fused");
    /* split never fuses (the two ops, the same bits); auto (unset, empty or "auto") fuses up
     * to REC_FUSED_END_MAX_BATCH requests (recurrent.cu), which is 0 since the one launch
     * measured slower at every batch: B=1, 16, 17 and 64, which fit, run the two ops. */
    decode_end_vs_chain(r, &ends[0], 4, false, NULL, "split");
    decode_end_vs_chain(r, &ends[6], 4, false, NULL, "split");
    decode_end_vs_chain(r, &ends[0], 4, false, NULL, NULL);
    decode_end_vs_chain(r, &ends[0], 4, false, NULL, "");
    decode_end_vs_chain(r, &ends[7], 4, false, NULL, "auto");
    decode_end_vs_chain(r, &ends[8], 4, false, NULL, "auto");
    decode_end_vs_chain(r, &ends[6], 4, false, NULL, NULL);
    decode_end_bad_value(r, &ends[0], 4);
    decode_end_bad_value(r, &ends[6], 4);
    decode_env_bad_value(r, &cases[0], "GDP_DECODE_STATE", "fastest", "smem");
    decode_env_bad_value(r, &cases[0], "GDP_DECODE_ROWS_COLS", "96", "128");
    decode_env_bad_value(r, &cases[0], "GDP_DECODE_RING_KSPLIT", "3", "2");
}

#endif /* GDP_HAVE_CUDA */

TEST_GPU_MAIN("test_recurrent_gpu", decode_tests, 20261129)
