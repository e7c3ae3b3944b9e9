/*
 * test_golden_chunk.c: the CPU chunked prefill and the CPU recurrent oracle against the five
 * chunk_*.safetensors golden files (float64 recurrence on bf16 inputs, made outside this
 * project). Each file is run with its metadata (num_householder, scale,
 * use_qk_l2norm_in_kernel), inputs, descriptors and initial_state, with return_chunk_states
 * and a dense final state; o, the final states and the chunk state rows < chunk_offsets[N]
 * must be within relative RMS 1e-5 (the golden README's CPU bar) and elementwise
 * atol = rtol = 2e-2; rows of o past cu_seqlens[N] exactly 0; chunk state rows past
 * chunk_offsets[N] untouched. The file's inputs converted to fp32 must give the same bits as
 * the bf16 inputs (the CPU reads both exactly). gdp_build_chunk_descriptors on the file's
 * cu_seqlens must reproduce the file's descriptors. A missing file is a failure.
 */
#include <string.h>

#include "internal.h"
#include "test_common.h"

static const char *const GOLDEN_FILES[5] = {
    "chunk_m1_k64_single.safetensors", "chunk_m2_k64_varlen.safetensors", "chunk_m3_k100_padded.safetensors",
    "chunk_m4_k128_scale.safetensors", "chunk_m2_k128_v64_long.safetensors",
};
static const double CPU_REL_BAR = 1e-5; /* golden README: CPU reference, double math */
static const double ELEM_TOL = 2e-2;    /* Megatron's elementwise atol = rtol */

typedef gdp_status_t (*chunk_op_fn)(gdp_ctx_t, const gdp_chunk_args *);

static bool bytes_equal_to(const void *p, size_t n, unsigned char value) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != value) return false;
    return true;
}

/* A fp32 copy of a tensor (same values: bf16 -> fp32 is exact). */
static gdp_tensor to_fp32(const gdp_tensor *t) {
    gdp_tensor c = test_tensor_alloc(GDP_DTYPE_FP32, t->ndim, t->shape);
    for (int64_t i = 0; i < gdp_tensor_numel(t); i++) gdp_tensor_set(&c, i, gdp_tensor_get(t, i));
    return c;
}

typedef struct golden_outputs {
    gdp_tensor o, final_state, chunk_states;
} golden_outputs;

/* Runs `fn` on args with fresh poisoned outputs. */
static void run_op(gdp_ctx_t ctx, chunk_op_fn fn, gdp_chunk_args a, const int64_t *o_shape, const int64_t *fs_shape,
                   const int64_t *cs_shape, golden_outputs *out) {
    out->o = test_tensor_alloc(GDP_DTYPE_FP32, 4, o_shape);
    out->final_state = test_tensor_alloc(GDP_DTYPE_FP32, 4, fs_shape);
    out->chunk_states = test_tensor_alloc(GDP_DTYPE_FP32, 4, cs_shape);
    memset(out->o.data, 0xff, test_tensor_bytes(&out->o)); /* NaN: "exactly 0" must be written */
    memset(out->final_state.data, 0xff, test_tensor_bytes(&out->final_state));
    memset(out->chunk_states.data, 0x7f, test_tensor_bytes(&out->chunk_states));
    a.o = out->o;
    a.final_state = out->final_state;
    a.output_final_state = 1;
    a.chunk_states = out->chunk_states;
    a.return_chunk_states = 1;
    CHECK_OK(fn(ctx, &a));
}

static void free_outputs(golden_outputs *out) {
    free(out->o.data);
    free(out->final_state.data);
    free(out->chunk_states.data);
}

/* Compares one run with the file's references. */
static void check_outputs(const char *what, const golden_outputs *out, gdp_st_file *f, int64_t end_token,
                          int64_t real_chunks) {
    int64_t n_o, n_fs, n_cs;
    double *o_ref = test_st_f64(f, "o_ref", &n_o);
    double *fs_ref = test_st_f64(f, "final_state_ref", &n_fs);
    double *cs_ref = test_st_f64(f, "chunk_states_ref", &n_cs);
    if (o_ref == NULL || fs_ref == NULL || cs_ref == NULL) {
        free(o_ref); free(fs_ref); free(cs_ref);
        return;
    }
    const int64_t row_o = out->o.shape[2] * out->o.shape[3];
    const int64_t row_s = out->chunk_states.shape[1] * out->chunk_states.shape[2] * out->chunk_states.shape[3];
    double *o = test_tensor_f64(&out->o), *fs = test_tensor_f64(&out->final_state);
    double *cs = test_tensor_f64(&out->chunk_states);
    char w[256];

    snprintf(w, sizeof w, "%s o", what);
    test_compare(w, o, o_ref, end_token * row_o, CPU_REL_BAR, ELEM_TOL, ELEM_TOL);
    const int64_t tail = out->o.shape[1] - end_token;
    CHECK(bytes_equal_to((float *)out->o.data + end_token * row_o, (size_t)(tail * row_o) * sizeof(float), 0),
          "%s: the %lld rows of o past cu_seqlens[N] are not exactly 0", what, (long long)tail);
    bool ref_tail_zero = true;
    for (int64_t i = end_token * row_o; i < n_o; i++) ref_tail_zero = ref_tail_zero && o_ref[i] == 0.0;
    CHECK(ref_tail_zero, "%s: o_ref rows past cu_seqlens[N] are not 0 (golden file inconsistent)", what);

    snprintf(w, sizeof w, "%s final state", what);
    test_compare(w, fs, fs_ref, n_fs, CPU_REL_BAR, ELEM_TOL, ELEM_TOL);
    snprintf(w, sizeof w, "%s chunk states", what);
    test_compare(w, cs, cs_ref, real_chunks * row_s, CPU_REL_BAR, ELEM_TOL, ELEM_TOL);
    CHECK(bytes_equal_to((float *)out->chunk_states.data + real_chunks * row_s,
                         (size_t)((out->chunk_states.shape[0] - real_chunks) * row_s) * sizeof(float), 0x7f),
          "%s: chunk_states rows past chunk_offsets[N] = %lld were written", what, (long long)real_chunks);
    printf("  %-58s rel RMS o %.2e, final %.2e, chunk states %.2e\n", what,
           test_rel_rms(o, o_ref, end_token * row_o), test_rel_rms(fs, fs_ref, n_fs),
           test_rel_rms(cs, cs_ref, real_chunks * row_s));
    free(o); free(fs); free(cs); free(o_ref); free(fs_ref); free(cs_ref);
}

/* gdp_build_chunk_descriptors on the file's cu_seqlens reproduces its descriptors. */
static void check_descriptors(const char *name, const gdp_tensor *cu, int32_t M, int64_t padded_tokens,
                              const gdp_tensor *ci, const gdp_tensor *cidp, const gdp_tensor *co) {
    const int32_t N = (int32_t)(cu->shape[0] - 1);
    int64_t rows, rows_dp;
    CHECK_OK(gdp_max_chunk_counts(padded_tokens, N, M, &rows, &rows_dp));
    int32_t *b_ci = calloc((size_t)(2 * rows + 1), sizeof(int32_t)), *b_cidp = calloc((size_t)(2 * rows_dp + 1), sizeof(int32_t));
    int32_t *b_co = calloc((size_t)(N + 1), sizeof(int32_t));
    int64_t n_rows = -1, n_rows_dp = -1;
    CHECK_OK(gdp_build_chunk_descriptors(cu->data, N, M, padded_tokens, b_ci, b_cidp, b_co, &n_rows, &n_rows_dp));
    CHECK(n_rows == ci->shape[0] && n_rows_dp == cidp->shape[0],
          "%s: builder gives %lld / %lld descriptor rows, the file has %lld / %lld", name, (long long)n_rows,
          (long long)n_rows_dp, (long long)ci->shape[0], (long long)cidp->shape[0]);
    if (n_rows == ci->shape[0] && n_rows_dp == cidp->shape[0]) {
        CHECK(memcmp(b_ci, ci->data, (size_t)(2 * n_rows) * sizeof(int32_t)) == 0, "%s: chunk_indices differ", name);
        CHECK(memcmp(b_cidp, cidp->data, (size_t)(2 * n_rows_dp) * sizeof(int32_t)) == 0,
              "%s: chunk_indices_dp differ", name);
    }
    CHECK(memcmp(b_co, co->data, (size_t)(N + 1) * sizeof(int32_t)) == 0, "%s: chunk_offsets differ", name);
    free(b_ci); free(b_cidp); free(b_co);
}

static void run_file(gdp_ctx_t ctx, const char *name) {
    gdp_st_file *f = test_golden_open(name); /* records a failure when missing */
    if (f == NULL) return;
    const double M_meta = test_st_meta_num(f, "num_householder", -1);
    const double scale = test_st_meta_num(f, "scale", -1);
    const double l2norm = test_st_meta_num(f, "use_qk_l2norm_in_kernel", -1);
    const double padded = test_st_meta_num(f, "padded_tokens", -1);
    CHECK(M_meta >= 1 && scale > 0 && l2norm >= 0 && padded >= 0,
          "%s: metadata num_householder %g, scale %g, use_qk_l2norm_in_kernel %g, padded_tokens %g missing", name,
          M_meta, scale, l2norm, padded);
    gdp_tensor q, k, v, g, beta, init, cu, ci, cidp, co;
    bool ok = test_st_tensor(f, "q", &q) & test_st_tensor(f, "k", &k) & test_st_tensor(f, "v", &v) &
              test_st_tensor(f, "g", &g) & test_st_tensor(f, "beta", &beta) &
              test_st_tensor(f, "initial_state", &init) & test_st_tensor(f, "cu_seqlens", &cu) &
              test_st_tensor(f, "chunk_indices", &ci) & test_st_tensor(f, "chunk_indices_dp", &cidp) &
              test_st_tensor(f, "chunk_offsets", &co);
    const gdp_st_info *cs_info = gdp_st_find(f, "chunk_states_ref");
    CHECK(cs_info != NULL, "%s: chunk_states_ref missing", name);
    if (ok && cs_info != NULL && M_meta >= 1) {
        const int32_t M = (int32_t)M_meta;
        const int64_t T = q.shape[1], H = q.shape[2], K = q.shape[3], V = v.shape[3], N = cu.shape[0] - 1;
        const int32_t *cu_v = cu.data, *co_v = co.data;
        CHECK((int64_t)padded == T, "%s: padded_tokens %g != T %lld", name, padded, (long long)T);
        check_descriptors(name, &cu, M, (int64_t)padded, &ci, &cidp, &co);

        const int64_t o_shape[4] = {1, T, H, V}, fs_shape[4] = {N, H, K, V};
        const int64_t cs_shape[4] = {cs_info->shape[0], H, K, V};
        gdp_chunk_args a = {
            .q = q, .k = k, .v = v, .g = g, .beta = beta, .num_householder = M, .cu_seqlens = cu, .scale = scale,
            .initial_state = init, .use_qk_l2norm_in_kernel = l2norm != 0, .chunk_indices = ci,
            .chunk_indices_dp = cidp, .chunk_offsets = co,
        };
        printf("%s: M=%d T=%lld H=%lld K=%lld V=%lld N=%lld l2norm=%d scale=%g\n", name, M, (long long)T,
               (long long)H, (long long)K, (long long)V, (long long)N, l2norm != 0, scale);
        golden_outputs chunked, oracle, chunked_fp32;
        run_op(ctx, gdp_chunk_gated_delta_product_varlen, a, o_shape, fs_shape, cs_shape, &chunked);
        check_outputs("chunked (bf16 inputs)", &chunked, f, cu_v[N], co_v[N]);
        run_op(ctx, gdp_gated_delta_product_recurrent_ref, a, o_shape, fs_shape, cs_shape, &oracle);
        check_outputs("recurrent_ref (bf16 inputs)", &oracle, f, cu_v[N], co_v[N]);

        /* The same values as fp32 tensors: identical bits out. */
        gdp_tensor q32 = to_fp32(&q), k32 = to_fp32(&k), v32 = to_fp32(&v), b32 = to_fp32(&beta);
        gdp_chunk_args a32 = a;
        a32.q = q32; a32.k = k32; a32.v = v32; a32.beta = b32;
        run_op(ctx, gdp_chunk_gated_delta_product_varlen, a32, o_shape, fs_shape, cs_shape, &chunked_fp32);
        CHECK(memcmp(chunked.o.data, chunked_fp32.o.data, test_tensor_bytes(&chunked.o)) == 0 &&
                  memcmp(chunked.final_state.data, chunked_fp32.final_state.data,
                         test_tensor_bytes(&chunked.final_state)) == 0 &&
                  memcmp(chunked.chunk_states.data, chunked_fp32.chunk_states.data,
                         test_tensor_bytes(&chunked.chunk_states)) == 0,
              "%s: fp32 copies of the bf16 inputs give different outputs", name);
        free(q32.data); free(k32.data); free(v32.data); free(b32.data);
        free_outputs(&chunked);
        free_outputs(&oracle);
        free_outputs(&chunked_fp32);
    }
    free(q.data); free(k.data); free(v.data); free(g.data); free(beta.data); free(init.data);
    free(cu.data); free(ci.data); free(cidp.data); free(co.data);
    gdp_st_close(f);
}

int main(void) {
    gdp_ctx_t ctx;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    printf("golden directory: %s\n", test_golden_dir());
    for (int i = 0; i < 5; i++) run_file(ctx, GOLDEN_FILES[i]);
    gdp_ctx_free(ctx);
    return test_finish("test_golden_chunk");
}
