/*
 * test_chunk_gpu.c: the CUDA chunked prefill (gdp_chunk_gated_delta_product_varlen) and the
 * CUDA chunk-local cumsum, through the public API, against the golden files and against the
 * CPU backend run on the same 16-bit inputs (double math). Bars (gdp-math.md 8): relative
 * RMS < 8e-3 on o, final states and chunk states, and |a - b| <= 2e-2 + 2e-2 |b| elementwise.
 *
 * Checked: the five chunk_* golden files; random shapes (M 1..4, K 64/72/100/128/256,
 * V 64/96/128, varlen with zero-length sequences and padded tails, initial state on/off and
 * in bf16, L2 norm on/off, fp16 inputs, fp32 beta); the derived-descriptor path equal bit for
 * bit to the descriptor path; two runs bitwise equal; cache mode (fp32 and bf16 cache, V = 64 and 128) with -1
 * rows: unnamed slots byte-identical, named slots and the -1 request's outputs against the
 * CPU, padded rows exactly 0; a padded run equal bit for bit to the unpadded one on real rows;
 * chunk-state rows past chunk_offsets[N] untouched; a CUDA graph captured with descriptors and
 * replayed on new data (new lengths, same padded shape) equal to eager runs; fp32 q ->
 * UNSUPPORTED, a missing workspace reservation and a bad GDP_CHUNK_STATE_VB -> INVALID_USAGE,
 * all writing nothing. The state sweep's value-column block width (GDP_CHUNK_STATE_VB = 64,
 * 32, 16, set between calls): o, final states, chunk states and cache slots bitwise equal across
 * the three widths and the automatic choice, on the golden files, a single long sequence,
 * varlen (lengths 1, 63, 64, 65), K or V = 64, K = 256, padded K and V, M = 1..3, fp16, and
 * cache mode with -1 slots; each width's results also against the reference. Every case but
 * the widths runs four times: GDP_CHUNK_PATH=staged, =fused (the one-pass kernel where K, V <=
 * 128), =hopper (the one-pass wgmma kernel where K and V are each 64 or 128, on a compute capability 9.0
 * device, checked to have run there) and unset (the op's choice); an unknown path -> INVALID_USAGE
 * naming it, writing nothing.
 * The Hopper kernel's exact segment split (GDP_CHUNK_SEGMENT = 1, 2, 3 expanded chunks a segment,
 * each sequence's first segment twice that, forced; auto on a sequence longer than its smallest first
 * segment; off): lengths 1 to 1100 whose tokens
 * straddle segment boundaries (M = 3), K and V each 64 and 128, fp16, an initial state, each against
 * the CPU backend, the split checked to have run with the forced length, two runs bitwise equal; each
 * also without chunk states (the split's outputs' correction instead of its second pass: the same
 * bars, its own determinism); under segments of 2 the cache cases (K = 64 among them) and the graph
 * replay again, with and without chunk states; a bad value -> INVALID_USAGE.
 * The Hopper kernel's tiles by its aux threads' cp.async, by tensor-map copies
 * (GDP_CHUNK_HOPPER_COPY=tma) and under auto (the default: tma at V = 128), with NaN in the padding
 * rows past the last sequence, K = 64 and 128, V = 64 and 128: bitwise equal, each against the CPU
 * backend, the kernel checked to have taken each
 * case on a 9.0 device; a bad value -> INVALID_USAGE.
 * The state sweep's copies by one producer warp (the default), by its tensor-map copies
 * (GDP_CHUNK_STATE_COPY=tma) and by every warp (warps): bitwise equal on every width case; a bad
 * value -> INVALID_USAGE.
 * WY's inverse on CUDA cores in fp32 (GDP_CHUNK_WY_INVERSE=fp32; the default is tf32 tensor
 * cores): the golden files and the random shapes again on the staged path, against the same
 * references; a bad value -> INVALID_USAGE.
 * The op's own choice (auto) on a 9.0 device: what gdp_chunk_auto_choose says for each shape (the
 * Hopper kernel unsplit for a batch of equal sequences when max_seqlen says so or the lengths are read,
 * the staged chain when the longest is unknown or far longer than the rest, the segment split on one
 * 1 x 16384 sequence, bitwise equal to the forced split); each run against the CPU backend (the long
 * one against the staged chain).
 * GDP_TEST_CHUNK_PATH=staged|fused|hopper|auto runs one path only (for the sanitizers);
 * GDP_TEST_CHUNK_ONLY=segments the Hopper path's segment-split cases only; with it,
 * GDP_TEST_CHUNK_REPEAT=0 skips their second runs (which check determinism only), halving a
 * racecheck run of them.
 * The profile's stage split (gdp/profile.h) under each path: a profiled call gives the same bits,
 * the staged path fills the cumsum, WY, state and output stages and not the fused one, the one-
 * kernel path the reverse, and the stages add up to no more than the profile's span; a CPU ctx
 * leaves them 0. Exits 77 when the library has no CUDA backend or no GPU is present.
 */
#include <string.h>

#include "gdp/profile.h"
#include "internal.h"
#include "kernels/gdp_kernels.h"
#include "test_gpu.h"

#ifdef GDP_HAVE_CUDA

static const double REL_BAR = 8e-3;  /* bf16 GPU chunk vs fp64 reference (gdp-math.md 8.3) */
static const double ELEM_TOL = 2e-2; /* Megatron's atol = rtol */

/* ---- device tensors (test_gpu.h) -------------------------------------------------------- */
/* Copies a host tensor into an existing device tensor of the same size. */
static void upload_into(gdp_tensor *d, const gdp_tensor *h) {
    CHECK(test_tensor_bytes(d) == test_tensor_bytes(h), "upload: buffer sizes differ");
    CUDA_OK(cudaMemcpy(d->data, h->data, test_tensor_bytes(h), cudaMemcpyHostToDevice));
}

static bool bytes_all(const void *p, size_t n, unsigned char value) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != value)
            return false;
    return true;
}

static void reserve_for(gdp_ctx_t ctx, int64_t T, int64_t N, int32_t M, int64_t H, int64_t K, int64_t V) {
    size_t bytes = 0;
    CHECK_OK(gdp_chunk_get_workspace_size(T, N, M, (int32_t)H, (int32_t)K, (int32_t)V, &bytes));
    CHECK_OK(gdp_ctx_reserve_workspace(ctx, bytes));
}

/* ---- random inputs ----------------------------------------------------------------------------- */
typedef struct chunk_case {
    const char *name;
    int32_t M, H, K, V;
    int n_seq;
    int32_t lens[10];
    int64_t T;               /* padded tokens, >= the sum of lens */
    gdp_dtype_t dtype;       /* q, k, v */
    gdp_dtype_t beta_dtype;
    gdp_dtype_t init_dtype;  /* initial_state; GDP_DTYPE_NUM: none */
    int l2norm;              /* use_qk_l2norm_in_kernel (off: keys are unit rows already) */
    double scale;            /* 0: K^-0.5 */
    double g_scale;          /* decays in [-g_scale, 0], a quarter of them exactly 0 */
} chunk_case;

typedef struct inputs {
    int32_t M;
    int64_t T, N, H, K, V, num_chunks, num_chunks_dp;
    double scale;
    int l2norm;
    gdp_tensor q, k, v, g, beta, init, cu, ci, cidp, co; /* host */
} inputs;

static void build_descriptors(inputs *in) {
    int64_t rows = 0, rows_dp = 0;
    CHECK_OK(gdp_max_chunk_counts(in->T, in->N, in->M, &rows, &rows_dp));
    int64_t ci_shape[2] = {rows, 2}, cidp_shape[2] = {rows_dp, 2}, co_shape[1] = {in->N + 1};
    in->ci = test_tensor_alloc(GDP_DTYPE_INT32, 2, ci_shape);
    in->cidp = test_tensor_alloc(GDP_DTYPE_INT32, 2, cidp_shape);
    in->co = test_tensor_alloc(GDP_DTYPE_INT32, 1, co_shape);
    CHECK_OK(gdp_build_chunk_descriptors(in->cu.data, (int32_t)in->N, in->M, in->T, in->ci.data, in->cidp.data,
                                         in->co.data, &in->num_chunks, &in->num_chunks_dp));
}

static void make_inputs(const chunk_case *c, uint64_t seed, inputs *in) {
    test_rng r;
    test_rng_seed(&r, seed);
    memset(in, 0, sizeof *in);
    in->M = c->M;
    in->T = c->T;
    in->N = c->n_seq;
    in->H = c->H;
    in->K = c->K;
    in->V = c->V;
    in->scale = c->scale;
    in->l2norm = c->l2norm;
    const int64_t T = c->T, TM = c->T * c->M, H = c->H, K = c->K, V = c->V, N = c->n_seq;
    int64_t cu_shape[1] = {N + 1};
    in->cu = test_tensor_alloc(GDP_DTYPE_INT32, 1, cu_shape);
    int32_t *cu = in->cu.data;
    for (int64_t i = 0; i < N; i++)
        cu[i + 1] = cu[i] + c->lens[i];
    CHECK(cu[N] <= T, "%s: lengths exceed T", c->name);

    int64_t q_shape[4] = {1, T, H, K}, k_shape[4] = {1, TM, H, K}, v_shape[4] = {1, TM, H, V};
    int64_t g_shape[3] = {1, T, H}, b_shape[3] = {1, TM, H}, s_shape[4] = {N, H, K, V};
    in->q = test_tensor_alloc(c->dtype, 4, q_shape);
    in->k = test_tensor_alloc(c->dtype, 4, k_shape);
    in->v = test_tensor_alloc(c->dtype, 4, v_shape);
    in->g = test_tensor_alloc(GDP_DTYPE_FP32, 3, g_shape);
    in->beta = test_tensor_alloc(c->beta_dtype, 3, b_shape);
    test_fill_uniform(&in->q, &r, -1.0, 1.0);
    test_fill_uniform(&in->v, &r, -1.0, 1.0);
    test_fill_uniform(&in->beta, &r, 0.0, 1.0);
    double *row = calloc((size_t)K, sizeof(double));
    for (int64_t e = 0; e < TM * H; e++) {
        double ss = 0;
        for (int64_t d = 0; d < K; d++) {
            row[d] = test_uniform_range(&r, -1.0, 1.0);
            ss += row[d] * row[d];
        }
        /* Without the in-kernel norm the keys must be unit rows, else the recurrence diverges. */
        double f = c->l2norm ? 1.0 : 1.0 / sqrt(ss);
        for (int64_t d = 0; d < K; d++)
            gdp_tensor_set(&in->k, e * K + d, row[d] * f);
    }
    free(row);
    for (int64_t e = 0; e < T * H; e++)
        gdp_tensor_set(&in->g, e, test_uniform(&r) < 0.25 ? 0.0 : -c->g_scale * test_uniform(&r));
    if (c->init_dtype != GDP_DTYPE_NUM) {
        in->init = test_tensor_alloc(c->init_dtype, 4, s_shape);
        test_fill_uniform(&in->init, &r, -0.5, 0.5);
    }
    build_descriptors(in);
}

static void free_inputs(inputs *in) {
    gdp_tensor *all[] = {&in->q, &in->k, &in->v, &in->g, &in->beta, &in->init, &in->cu, &in->ci, &in->cidp, &in->co};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        test_host_free(all[i]);
}

/* ---- one run of the op ---------------------------------------------------------------------- */
typedef struct outputs {
    gdp_tensor o, fs, cs; /* host; fs absent in cache mode */
} outputs;

static void free_outputs(outputs *out) {
    test_host_free(&out->o);
    test_host_free(&out->fs);
    test_host_free(&out->cs);
}

static gdp_chunk_args base_args(const inputs *in) {
    gdp_chunk_args a;
    memset(&a, 0, sizeof a);
    a.q = in->q;
    a.k = in->k;
    a.v = in->v;
    a.g = in->g;
    a.beta = in->beta;
    a.num_householder = in->M;
    a.cu_seqlens = in->cu;
    a.scale = in->scale;
    a.initial_state = in->init;
    a.use_qk_l2norm_in_kernel = in->l2norm;
    a.chunk_indices = in->ci;
    a.chunk_indices_dp = in->cidp;
    a.chunk_offsets = in->co;
    return a;
}

/* The CPU reference: fp32 o, fp32 dense final state, chunk states in cs_dtype. */
static void cpu_run(gdp_ctx_t cpu, const inputs *in, gdp_dtype_t cs_dtype, outputs *out) {
    gdp_chunk_args a = base_args(in);
    int64_t o_shape[4] = {1, in->T, in->H, in->V}, s_shape[4] = {in->N, in->H, in->K, in->V};
    int64_t cs_shape[4] = {in->num_chunks, in->H, in->K, in->V};
    out->o = test_tensor_alloc(GDP_DTYPE_FP32, 4, o_shape);
    out->fs = test_tensor_alloc(GDP_DTYPE_FP32, 4, s_shape);
    out->cs = test_tensor_alloc(cs_dtype, 4, cs_shape);
    a.o = out->o;
    a.output_final_state = 1;
    a.final_state = out->fs;
    a.return_chunk_states = 1;
    a.chunk_states = out->cs;
    CHECK_OK(gdp_chunk_gated_delta_product_varlen(cpu, &a));
}

/* When set, gpu_run profiles its op call alone (gdp/profile.h) into it. */
static gdp_phase_times *g_profile_times;
/* gpu_run's max_seqlen (0: unknown, as every case but the auto-choice one passes it). */
static int64_t g_max_seqlen;
/* Whether gpu_run, test_cache and test_graph ask for chunk states (the Hopper split takes another
 * path without them: the outputs' correction instead of a second pass); without, outputs' cs is
 * empty and the comparisons skip it. */
static bool g_with_cs = true;

/* The GPU op on device copies; outputs poisoned first (o NaN, states NaN, chunk states 0x7f). */
static void gpu_run(gdp_ctx_t gpu, const inputs *in, bool with_desc, gdp_dtype_t cs_dtype, outputs *out) {
    gdp_chunk_args a = base_args(in);
    gdp_tensor d[10];
    const gdp_tensor *h[10] = {&in->q, &in->k, &in->v, &in->g, &in->beta, &in->init, &in->cu, &in->ci, &in->cidp, &in->co};
    for (int i = 0; i < 10; i++)
        d[i] = test_dev_upload(h[i]);
    a.q = d[0]; a.k = d[1]; a.v = d[2]; a.g = d[3]; a.beta = d[4]; a.initial_state = d[5]; a.cu_seqlens = d[6];
    if (with_desc) {
        a.chunk_indices = d[7]; a.chunk_indices_dp = d[8]; a.chunk_offsets = d[9];
    } else {
        memset(&a.chunk_indices, 0, sizeof a.chunk_indices);
        memset(&a.chunk_indices_dp, 0, sizeof a.chunk_indices_dp);
        memset(&a.chunk_offsets, 0, sizeof a.chunk_offsets);
    }
    int64_t o_shape[4] = {1, in->T, in->H, in->V}, s_shape[4] = {in->N, in->H, in->K, in->V};
    int64_t cs_shape[4] = {in->num_chunks, in->H, in->K, in->V};
    gdp_tensor d_o = test_dev_alloc(in->q.dtype, 4, o_shape, 0xff);
    gdp_tensor d_fs = test_dev_alloc(GDP_DTYPE_FP32, 4, s_shape, 0xff);
    gdp_tensor d_cs;
    memset(&d_cs, 0, sizeof d_cs);
    if (g_with_cs)
        d_cs = test_dev_alloc(cs_dtype, 4, cs_shape, 0x7f);
    a.o = d_o;
    a.output_final_state = 1;
    a.final_state = d_fs;
    a.return_chunk_states = g_with_cs;
    a.chunk_states = d_cs;
    a.max_seqlen = g_max_seqlen;
    reserve_for(gpu, in->T, in->N, in->M, in->H, in->K, in->V);
    if (g_profile_times != NULL)
        CHECK_OK(gdp_profile_begin(gpu));
    CHECK_OK(gdp_chunk_gated_delta_product_varlen(gpu, &a));
    if (g_profile_times != NULL)
        CHECK_OK(gdp_profile_end(gpu, g_profile_times));
    CUDA_OK(cudaDeviceSynchronize());
    out->o = test_dev_download(&d_o);
    out->fs = test_dev_download(&d_fs);
    memset(&out->cs, 0, sizeof out->cs);
    if (g_with_cs) {
        out->cs = test_dev_download(&d_cs);
        test_dev_free(&d_cs);
    }
    test_dev_free(&d_o);
    test_dev_free(&d_fs);
    for (int i = 0; i < 10; i++)
        test_dev_free(&d[i]);
}

/* GPU vs reference outputs (rows of real tokens and chunks), and the GPU's inert regions. */
static void compare_runs(const char *what, const inputs *in, const outputs *gpu, const outputs *ref, bool check_fs) {
    const int32_t *cu = in->cu.data, *co = in->co.data;
    const int64_t row_o = in->H * in->V, row_s = in->H * in->K * in->V;
    const int64_t end = cu[in->N], real_chunks = co[in->N];
    char w[256];
    double *a = test_tensor_f64(&gpu->o), *b = test_tensor_f64(&ref->o);
    snprintf(w, sizeof w, "%s: o", what);
    test_compare(w, a, b, end * row_o, REL_BAR, ELEM_TOL, ELEM_TOL);
    double rel_o = test_rel_rms(a, b, end * row_o);
    free(a);
    free(b);
    const size_t es = gdp_dtype_size(gpu->o.dtype);
    CHECK(bytes_all((char *)gpu->o.data + (size_t)(end * row_o) * es, (size_t)((in->T - end) * row_o) * es, 0),
          "%s: o rows past cu_seqlens[N] = %lld are not exactly 0", what, (long long)end);
    double rel_fs = 0;
    if (check_fs) {
        a = test_tensor_f64(&gpu->fs);
        b = test_tensor_f64(&ref->fs);
        snprintf(w, sizeof w, "%s: final state", what);
        test_compare(w, a, b, in->N * row_s, REL_BAR, ELEM_TOL, ELEM_TOL);
        rel_fs = test_rel_rms(a, b, in->N * row_s);
        free(a);
        free(b);
    }
    if (gpu->cs.data == NULL) { /* not asked (g_with_cs) */
        printf("  %-52s rel RMS o %.2e  final %.2e  (no chunk states)\n", what, rel_o, rel_fs);
        return;
    }
    a = test_tensor_f64(&gpu->cs);
    b = test_tensor_f64(&ref->cs);
    snprintf(w, sizeof w, "%s: chunk states", what);
    test_compare(w, a, b, real_chunks * row_s, REL_BAR, ELEM_TOL, ELEM_TOL);
    double rel_cs = test_rel_rms(a, b, real_chunks * row_s);
    free(a);
    free(b);
    const size_t cs_es = gdp_dtype_size(gpu->cs.dtype);
    CHECK(bytes_all((char *)gpu->cs.data + (size_t)(real_chunks * row_s) * cs_es,
                    (size_t)((gpu->cs.shape[0] - real_chunks) * row_s) * cs_es, 0x7f),
          "%s: chunk_states rows past chunk_offsets[N] = %lld were written", what, (long long)real_chunks);
    printf("  %-52s rel RMS o %.2e  final %.2e  chunk states %.2e\n", what, rel_o, rel_fs, rel_cs);
}

static bool same_bytes(const gdp_tensor *a, const gdp_tensor *b) {
    return test_tensor_bytes(a) == test_tensor_bytes(b) && memcmp(a->data, b->data, test_tensor_bytes(a)) == 0;
}

/* The state sweep's value-column block widths (kernels/chunk/state.cuh); 0 = the op's choice. */
static const int STATE_VBS[4] = {64, 32, 16, 0};

/* GDP_CHUNK_STATE_VB for the next calls (the launcher reads it on every call); 0 unsets it. */
static void set_state_vb(int vb) {
    if (vb == 0) {
        unsetenv("GDP_CHUNK_STATE_VB");
        return;
    }
    char text[16];
    snprintf(text, sizeof text, "%d", vb);
    setenv("GDP_CHUNK_STATE_VB", text, 1);
}

/* GDP_CHUNK_PATH for the next calls (staged | fused | auto; NULL unsets it). */
static void set_chunk_path(const char *path) {
    if (path == NULL)
        unsetenv("GDP_CHUNK_PATH");
    else
        setenv("GDP_CHUNK_PATH", path, 1);
}

/* o, the final states (with_fs) and the chunk states where both runs asked for them, bit for bit. */
static bool same_outputs(const outputs *a, const outputs *b, bool with_fs) {
    const bool cs = a->cs.data == NULL || b->cs.data == NULL || same_bytes(&a->cs, &b->cs);
    return same_bytes(&a->o, &b->o) && (!with_fs || same_bytes(&a->fs, &b->fs)) && cs;
}

/* ---- golden files ------------------------------------------------------------------------------- */
static void test_golden(gdp_ctx_t gpu) {
    static const char *const files[5] = {
        "chunk_m1_k64_single.safetensors", "chunk_m2_k64_varlen.safetensors", "chunk_m3_k100_padded.safetensors",
        "chunk_m4_k128_scale.safetensors", "chunk_m2_k128_v64_long.safetensors",
    };
    printf("golden files (%s):\n", test_golden_dir());
    for (int fi = 0; fi < 5; fi++) {
        gdp_st_file *f = test_golden_open(files[fi]);
        if (f == NULL)
            continue;
        inputs in;
        memset(&in, 0, sizeof in);
        bool ok = test_st_tensor(f, "q", &in.q) & test_st_tensor(f, "k", &in.k) & test_st_tensor(f, "v", &in.v) &
                  test_st_tensor(f, "g", &in.g) & test_st_tensor(f, "beta", &in.beta) &
                  test_st_tensor(f, "initial_state", &in.init) & test_st_tensor(f, "cu_seqlens", &in.cu) &
                  test_st_tensor(f, "chunk_indices", &in.ci) & test_st_tensor(f, "chunk_indices_dp", &in.cidp) &
                  test_st_tensor(f, "chunk_offsets", &in.co);
        outputs ref;
        memset(&ref, 0, sizeof ref);
        ok = ok && test_st_tensor(f, "o_ref", &ref.o) && test_st_tensor(f, "final_state_ref", &ref.fs) &&
             test_st_tensor(f, "chunk_states_ref", &ref.cs);
        if (ok) {
            in.M = (int32_t)test_st_meta_num(f, "num_householder", 1);
            in.scale = test_st_meta_num(f, "scale", 0);
            in.l2norm = test_st_meta_num(f, "use_qk_l2norm_in_kernel", 0) != 0;
            in.T = in.q.shape[1];
            in.H = in.q.shape[2];
            in.K = in.q.shape[3];
            in.V = in.v.shape[3];
            in.N = in.cu.shape[0] - 1;
            in.num_chunks = in.ci.shape[0];
            in.num_chunks_dp = in.cidp.shape[0];
            CHECK(ref.cs.shape[0] == in.num_chunks, "%s: chunk_states_ref has %lld rows, descriptors %lld", files[fi],
                  (long long)ref.cs.shape[0], (long long)in.num_chunks);
            outputs first;
            for (int wi = 0; wi < 4; wi++) {
                outputs out;
                set_state_vb(STATE_VBS[wi]);
                gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &out);
                char w[160];
                snprintf(w, sizeof w, "%s (M=%d K=%lld V=%lld) state VB %d", files[fi], in.M, (long long)in.K,
                         (long long)in.V, STATE_VBS[wi]);
                /* the reference's chunk-state rows past chunk_offsets[N] are 0 (no meaning): compare real rows */
                compare_runs(w, &in, &out, &ref, true);
                if (wi == 0) {
                    first = out;
                    continue;
                }
                CHECK(same_outputs(&out, &first, true), "%s: o / final / chunk states differ from state VB 64", w);
                free_outputs(&out);
            }
            set_state_vb(0);
            free_outputs(&first);
        }
        free_outputs(&ref);
        free_inputs(&in);
        gdp_st_close(f);
    }
}

/* ---- random shapes vs the CPU backend, derived descriptors, determinism ------------------------------ */
static void test_random(gdp_ctx_t cpu, gdp_ctx_t gpu) {
    const gdp_dtype_t BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16, F32 = GDP_DTYPE_FP32, NONE = GDP_DTYPE_NUM;
    const chunk_case cases[] = {
        {"m1 k64 v64 single, unit keys", 1, 2, 64, 64, 1, {63}, 63, BF, BF, NONE, 0, 0.125, 0.5},
        {"m2 k128 v128 varlen, zero-length, tail", 2, 3, 128, 128, 5, {100, 0, 200, 64, 65}, 480, BF, BF, F32, 1, 0, 0.1},
        {"m3 k100 v64 padded (K boundary path)", 3, 2, 100, 64, 4, {130, 64, 7, 0}, 256, BF, BF, F32, 1, 0.1, 0.5},
        {"m4 k64 v128 no initial state", 4, 2, 64, 128, 2, {257, 31}, 320, BF, BF, NONE, 1, 0, 0.05},
        {"m2 k256 v128", 2, 2, 256, 128, 2, {100, 150}, 256, BF, BF, F32, 1, 0, 0.1},
        {"m2 k128 v64 fp16", 2, 2, 128, 64, 2, {90, 170}, 300, F16, F16, F32, 1, 0, 0.1},
        {"m2 k128 v128 fp16", 2, 2, 128, 128, 2, {90, 170}, 300, F16, F16, F32, 1, 0, 0.1},
        {"m3 k72 v96 unit keys, fp32 beta", 3, 2, 72, 96, 2, {50, 129}, 200, BF, F32, F32, 0, 0, 0.3},
        /* V % 8 != 0: element-wise value loads and output stores (no 16-byte vectors) */
        {"m2 k64 v60 element-wise output rows", 2, 2, 64, 60, 2, {70, 129}, 210, BF, BF, F32, 1, 0, 0.1},
        {"m1 k128 v128 long, bf16 initial state", 1, 2, 128, 128, 1, {700}, 704, BF, BF, BF, 1, 0, 0.02},
        /* more state-sweep blocks than SMs: the two-stage pipeline (few blocks take the deep one) */
        {"m2 k128 v128 10 heads x 8 seqs", 2, 10, 128, 128, 8, {70, 3, 130, 64, 0, 99, 1, 40}, 420, BF, BF, F32, 1, 0,
         0.1},
        {"m3 k64 v64 20 heads x 8 seqs", 3, 20, 64, 64, 8, {33, 128, 0, 65, 7, 64, 20, 90}, 420, BF, BF, F32, 1, 0,
         0.2},
        {"m5 k128 v128 varlen 65,1,140", 5, 2, 128, 128, 3, {65, 1, 140}, 256, BF, BF, F32, 1, 0, 0.1},
        /* K = 128 without the in-kernel norm: the Hopper kernel's key and query scales stay 1 (no golden
         * file has it at K = 128); last, so that the cases above keep their seeds */
        {"m2 k128 v128 unit keys, no in-kernel norm", 2, 2, 128, 128, 3, {90, 64, 170}, 330, BF, BF, F32, 0, 0, 0.2},
    };
    printf("random shapes vs the CPU backend (same 16-bit inputs, double math):\n");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const chunk_case *c = &cases[ci];
        inputs in;
        make_inputs(c, 1000 + ci, &in);
        outputs ref, out, again, derived;
        cpu_run(cpu, &in, GDP_DTYPE_FP32, &ref);
        gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &out);
        compare_runs(c->name, &in, &out, &ref, true);
        gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &again);
        CHECK(same_bytes(&out.o, &again.o) && same_bytes(&out.fs, &again.fs) && same_bytes(&out.cs, &again.cs),
              "%s: two runs differ (not deterministic)", c->name);
        gpu_run(gpu, &in, false, GDP_DTYPE_FP32, &derived);
        CHECK(same_bytes(&out.o, &derived.o) && same_bytes(&out.fs, &derived.fs),
              "%s: derived descriptors give different o / final state than given ones", c->name);
        const int64_t real = ((const int32_t *)in.co.data)[in.N], row_s = in.H * in.K * in.V;
        CHECK(memcmp(out.cs.data, derived.cs.data, (size_t)(real * row_s) * sizeof(float)) == 0,
              "%s: derived descriptors give different chunk states", c->name);
        free_outputs(&ref);
        free_outputs(&out);
        free_outputs(&again);
        free_outputs(&derived);
        free_inputs(&in);
    }
}

/* ---- the state sweep's column-block widths: bitwise equal results ---------------------------------- */
static void test_state_widths(gdp_ctx_t cpu, gdp_ctx_t gpu) {
    const gdp_dtype_t BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16, F32 = GDP_DTYPE_FP32, NONE = GDP_DTYPE_NUM;
    const chunk_case cases[] = {
        {"widths: m2 k128 v128 one long sequence", 2, 2, 128, 128, 1, {1500}, 1536, BF, BF, F32, 1, 0, 0.02},
        {"widths: m3 k128 v128 varlen 1,63,64,65,300,0", 3, 2, 128, 128, 6, {1, 63, 64, 65, 300, 0}, 512, BF, BF,
         F32, 1, 0, 0.1},
        {"widths: m1 k64 v64 varlen", 1, 3, 64, 64, 3, {200, 65, 1}, 300, BF, BF, BF, 1, 0, 0.1},
        {"widths: m2 k128 v64", 2, 2, 128, 64, 2, {130, 257}, 400, BF, BF, F32, 1, 0, 0.1},
        {"widths: m3 k64 v128 no initial state", 3, 2, 64, 128, 2, {150, 64}, 256, BF, BF, NONE, 1, 0, 0.1},
        {"widths: m2 k256 v64 (idle v_new warps at VB 16)", 2, 2, 256, 64, 2, {100, 170}, 300, BF, BF, F32, 1, 0,
         0.1},
        {"widths: m1 k100 v96 padded K and V", 1, 2, 100, 96, 2, {90, 200}, 320, BF, BF, F32, 1, 0.1, 0.3},
        {"widths: m2 k128 v128 fp16", 2, 2, 128, 128, 2, {190, 77}, 300, F16, F16, F32, 1, 0, 0.1},
        /* 320 to 1,280 state blocks: more than an H200's 132 SMs at every width, so the sweep's
         * two-stage pipeline (the cases above take the four-stage one) */
        {"widths: m2 k128 v128 10 sequences x 16 heads", 2, 16, 128, 128, 10,
         {70, 130, 64, 1, 200, 90, 65, 33, 128, 150}, 960, BF, BF, F32, 1, 0, 0.1},
    };
    printf("state sweep column blocks %d, %d, %d and the op's choice, copies by every warp, by a producer warp and by "
           "its tensor-map copies: "
           "bitwise equal, each vs the CPU backend:\n",
           STATE_VBS[0], STATE_VBS[1], STATE_VBS[2]);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const chunk_case *c = &cases[ci];
        inputs in;
        make_inputs(c, 5000 + ci, &in);
        outputs ref, first;
        cpu_run(cpu, &in, GDP_DTYPE_FP32, &ref);
        /* each width with the copies issued by every warp, by the producer warp's cp.async, then by its
         * tensor-map copies (state.cuh's STATE_COPY_*) */
        static const char *const copy_mode[3] = {"warps", "producer", "tma"};
        for (int wi = 0; wi < 12; wi++) {
            outputs out;
            set_state_vb(STATE_VBS[wi % 4]);
            setenv("GDP_CHUNK_STATE_COPY", copy_mode[wi / 4], 1);
            gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &out);
            char w[160];
            snprintf(w, sizeof w, "%s, VB %d, copies: %s", c->name, STATE_VBS[wi % 4], copy_mode[wi / 4]);
            compare_runs(w, &in, &out, &ref, true);
            if (wi == 0) {
                first = out;
                continue;
            }
            CHECK(same_outputs(&out, &first, true), "%s: o / final / chunk states differ from state VB %d", w,
                  STATE_VBS[0]);
            free_outputs(&out);
        }
        unsetenv("GDP_CHUNK_STATE_COPY");
        set_state_vb(0);
        free_outputs(&first);
        free_outputs(&ref);
        free_inputs(&in);
    }
}

static bool hopper_device(int *major, int *minor); /* a compute capability 9.0 device (below) */

/* ---- the Hopper kernel's copy modes (GDP_CHUNK_HOPPER_COPY) ---------------------------------------------- */
/* Its tiles by the aux threads' cp.async, by tensor-map copies and under auto: bitwise equal, each
 * against the CPU backend. The tensor-map copies land whole 64-row boxes, rows past a sequence's end included,
 * and the kernel zeroes those rows of K and V: the padding rows past the last sequence hold NaN
 * here, so a row that is not zeroed (or a Q row past the chunk's queries that is used) shows. */
static void test_hopper_copies(gdp_ctx_t cpu, gdp_ctx_t gpu) {
    const gdp_dtype_t BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16, F32 = GDP_DTYPE_FP32;
    const chunk_case cases[] = {
        {"hopper copies: m2 k128 v128 varlen 1,63,64,65,300, NaN padding", 2, 2, 128, 128, 5, {1, 63, 64, 65, 300},
         560, BF, BF, F32, 1, 0, 0.1},
        {"hopper copies: m3 k128 v128 fp16, NaN padding", 3, 3, 128, 128, 2, {150, 77}, 260, F16, F16, F32, 1, 0, 0.1},
        {"hopper copies: m2 k128 v64, NaN padding", 2, 2, 128, 64, 3, {100, 57, 1}, 200, BF, BF, F32, 1, 0, 0.1},
        /* K = 64: one row block of the state a warpgroup, split by value columns */
        {"hopper copies: m2 k64 v128 varlen 1,63,64,65,300, NaN padding", 2, 2, 64, 128, 5, {1, 63, 64, 65, 300}, 560,
         BF, BF, F32, 1, 0, 0.1},
        {"hopper copies: m3 k64 v64 fp16, NaN padding", 3, 3, 64, 64, 2, {150, 77}, 260, F16, F16, F32, 1, 0, 0.1},
        {"hopper copies: m1 k64 v128 no in-kernel norm, bf16 init", 1, 2, 64, 128, 3, {200, 1, 64}, 300, BF, BF, BF, 0,
         0, 0.2},
    };
    int major = 0, minor = 0;
    const bool on_hopper = hopper_device(&major, &minor);
    const double nan = NAN;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const chunk_case *c = &cases[ci];
        inputs in;
        make_inputs(c, 7000 + ci, &in);
        const int64_t real = ((const int32_t *)in.cu.data)[in.N];
        for (int64_t e = real * in.M * in.H * in.K; e < in.T * in.M * in.H * in.K; e++)
            gdp_tensor_set(&in.k, e, nan);
        for (int64_t e = real * in.M * in.H * in.V; e < in.T * in.M * in.H * in.V; e++)
            gdp_tensor_set(&in.v, e, nan);
        for (int64_t e = real * in.H * in.K; e < in.T * in.H * in.K; e++)
            gdp_tensor_set(&in.q, e, nan);
        outputs ref, first, out;
        cpu_run(cpu, &in, GDP_DTYPE_FP32, &ref);
        static const char *const mode[3] = {"threads", "tma", "auto"}; /* auto: the default's choice by V */
        for (int mi = 0; mi < 3; mi++) {
            setenv("GDP_CHUNK_HOPPER_COPY", mode[mi], 1);
            const long long before = gdp_cuda_chunk_hopper_calls();
            gpu_run(gpu, &in, true, GDP_DTYPE_FP32, mi == 0 ? &first : &out);
            char w[160];
            snprintf(w, sizeof w, "%s, copies: %s", c->name, mode[mi]);
            compare_runs(w, &in, mi == 0 ? &first : &out, &ref, true);
            if (on_hopper)
                CHECK(gdp_cuda_chunk_hopper_calls() > before, "%s: the Hopper kernel did not take the case", w);
            if (mi > 0) {
                CHECK(same_outputs(&out, &first, true), "%s: o / final / chunk states differ from the threads' copies", w);
                free_outputs(&out);
            }
        }
        unsetenv("GDP_CHUNK_HOPPER_COPY");
        free_outputs(&first);
        free_outputs(&ref);
        free_inputs(&in);
    }
}

/* ---- the Hopper kernel's exact segment split (GDP_CHUNK_SEGMENT) ------------------------------------- */
/* Sequences cut into segments of 1, 2 or 4 expanded chunks (forced), and auto on a sequence long
 * enough for it, against the CPU backend; the split must have run with that length (on a 9.0
 * device; elsewhere the op runs other kernels and the counter stays 0). The split's scratch is what
 * the ctx holds past the op's workspace when that is larger: 256 MB more than any case needs. */
static void test_hopper_segments(gdp_ctx_t cpu, gdp_ctx_t gpu, bool on_hopper) {
    const gdp_dtype_t BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16, F32 = GDP_DTYPE_FP32;
    const chunk_case cases[] = {
        {"segments: m2 k128 v128 varlen 1,63,64,65,300,700", 2, 2, 128, 128, 6, {1, 63, 64, 65, 300, 700}, 1200, BF,
         BF, F32, 1, 0, 0.1},
        {"segments: m3 k128 v64 fp16 200,513 (tokens straddle segments)", 3, 3, 128, 64, 2, {200, 513}, 720, F16, F16,
         F32, 1, 0, 0.1},
        {"segments: m1 k128 v128 long 1000, bf16 initial state", 1, 2, 128, 128, 1, {1000}, 1000, BF, BF, BF, 1, 0, 0.02},
        {"segments: m2 k128 v128 long 1100 (auto splits it)", 2, 2, 128, 128, 2, {1100, 40}, 1140, BF, BF, F32, 1, 0,
         0.05},
        /* K = 64: maps F of 64 x 64 */
        {"segments: m2 k64 v128 varlen 300,700", 2, 2, 64, 128, 2, {300, 700}, 1000, BF, BF, F32, 1, 0, 0.1},
        {"segments: m3 k64 v64 fp16 200,513 (tokens straddle segments)", 3, 3, 64, 64, 2, {200, 513}, 720, F16, F16,
         F32, 1, 0, 0.1},
    };
    static const char *const lengths[5] = {"1", "2", "3", "auto", "off"}; /* 3: not a power of two */
    const char *repeat_env = getenv("GDP_TEST_CHUNK_REPEAT");
    const bool repeat = repeat_env == NULL || strcmp(repeat_env, "0") != 0;
    CHECK_OK(gdp_ctx_reserve_workspace(gpu, (size_t)256 << 20));
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const chunk_case *c = &cases[ci];
        inputs in;
        make_inputs(c, 8100 + ci, &in);
        outputs ref;
        cpu_run(cpu, &in, GDP_DTYPE_FP32, &ref);
        for (int li = 0; li < 5; li++) {
            setenv("GDP_CHUNK_SEGMENT", lengths[li], 1);
            outputs out, again, bare, bare_again;
            gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &out);
            const int seg = gdp_cuda_chunk_hopper_last_segment();
            char w[200];
            snprintf(w, sizeof w, "%s, GDP_CHUNK_SEGMENT=%s (ran %d)", c->name, lengths[li], seg);
            compare_runs(w, &in, &out, &ref, true);
            if (on_hopper) {
                const int forced = li < 3 ? atoi(lengths[li]) : 0;
                if (forced > 0)
                    CHECK(seg == forced, "%s: the split ran with segments of %d", w, seg);
                else if (li == 4)
                    CHECK(seg == 0, "%s: split although off", w);
                else if (ci == 3) /* 1100 tokens x 2 = 35 chunks, more than auto's smallest first segment, 32 */
                    CHECK(seg >= 16, "%s: auto did not split a sequence of 35 chunks", w);
            }
            if (repeat) {
                gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &again);
                CHECK(same_outputs(&out, &again, true), "%s: two runs differ (not deterministic)", w);
                free_outputs(&again);
            }
            /* without chunk states the split corrects the outputs (o^G + O^F S_j) and the fix-up writes the
             * final state, instead of running the segments again: the same bars, its own determinism */
            g_with_cs = false;
            gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &bare);
            snprintf(w, sizeof w, "%s, GDP_CHUNK_SEGMENT=%s, no chunk states", c->name, lengths[li]);
            compare_runs(w, &in, &bare, &ref, true);
            if (repeat) {
                gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &bare_again);
                CHECK(same_outputs(&bare, &bare_again, true), "%s: two runs differ (not deterministic)", w);
                free_outputs(&bare_again);
            }
            g_with_cs = true;
            free_outputs(&out);
            free_outputs(&bare);
        }
        unsetenv("GDP_CHUNK_SEGMENT");
        free_outputs(&ref);
        free_inputs(&in);
    }
}

/* The op's own choice (GDP_CHUNK_PATH unset) among the staged chain, the Hopper kernel and its segment
 * split: on a 9.0 device the op must run what gdp_chunk_auto_choose (descriptors.c, whose decisions
 * test_descriptors checks on the measured rows) says for the run's shape, max_seqlen and SM count (the
 * longest sequence read from the lengths when no descriptors are given, and staged when it is unknown),
 * the split with the choice's segment length; elsewhere the staged chain. Every small run against the
 * CPU backend; the long sequence (1 x 16384, H 16: the split on an H100 or H200), with and without
 * chunk states, bitwise equal to the Hopper path forced to the same segment length and within the bars
 * of the staged chain's outputs (its CPU reference would take minutes). */
static void test_auto_choice(gdp_ctx_t cpu, gdp_ctx_t gpu) {
    const gdp_dtype_t BF = GDP_DTYPE_BF16, F32 = GDP_DTYPE_FP32;
    const chunk_case cases[4] = {
        {"auto: 6 x 256 tokens, H 16, M 2", 2, 16, 128, 128, 6, {256, 256, 256, 256, 256, 256}, 1536, BF, BF, F32, 1,
         0, 0.1},
        {"auto: 1000 + 5 x 16 tokens, H 16, M 2", 2, 16, 128, 128, 6, {1000, 16, 16, 16, 16, 16}, 1080, BF, BF, F32, 1,
         0, 0.1},
        {"auto: 6 x 256 tokens, H 16, M 2, K 64", 2, 16, 64, 128, 6, {256, 256, 256, 256, 256, 256}, 1536, BF, BF, F32,
         1, 0, 0.1},
        {"auto: 1 x 16384 tokens, H 16, M 2", 2, 16, 128, 128, 1, {16384}, 16384, BF, BF, F32, 1, 0, 0.02},
    };
    int major = 0, minor = 0, dev = 0, sms = 0;
    const bool on_hopper = hopper_device(&major, &minor);
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const struct {
        int ci; /* the case */
        int64_t max_seqlen;
        bool with_desc;
        const char *what;
    } runs[] = {
        {0, 256, true, "max_seqlen 256, descriptors"},
        {0, 0, true, "max_seqlen unknown, descriptors"},
        {0, 0, false, "no descriptors (lengths read)"},
        {1, 1000, true, "max_seqlen 1000, descriptors"},
        {1, 0, false, "no descriptors (lengths read)"},
        {2, 256, true, "max_seqlen 256, descriptors"},
        {3, 16384, true, "max_seqlen 16384, descriptors"},
    };
    CHECK_OK(gdp_ctx_reserve_workspace(gpu, (size_t)256 << 20));
    for (int ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) { /* inputs and reference once, then runs */
        const chunk_case *c = &cases[ci];
        const bool long_case = c->T > 4096;
        if (long_case && !on_hopper)
            continue; /* the long case is there for the split */
        inputs in;
        outputs ref;
        make_inputs(c, 8300 + ci, &in);
        if (long_case) { /* the staged chain's outputs stand in for the CPU reference */
            set_chunk_path("staged");
            gpu_run(gpu, &in, true, F32, &ref);
            set_chunk_path(NULL);
        } else {
            cpu_run(cpu, &in, F32, &ref);
        }
        int32_t longest = 0;
        for (int i = 0; i < c->n_seq; i++)
            longest = c->lens[i] > longest ? c->lens[i] : longest;
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            if (runs[r].ci != ci)
                continue;
            const gdp_chunk_auto want = gdp_chunk_auto_choose(in.num_chunks_dp, in.N, in.H, in.M, in.K, in.V,
                                                              runs[r].with_desc ? runs[r].max_seqlen : longest, sms);
            const bool want_hopper = on_hopper && want.path != GDP_CHUNK_AUTO_STAGED;
            const int want_seg = want_hopper && want.path == GDP_CHUNK_AUTO_HOPPER_SPLIT ? want.seg_chunks : 0;
            for (int with_cs = 1; with_cs >= (long_case ? 0 : 1); with_cs--) {
                g_with_cs = with_cs != 0;
                outputs out;
                g_max_seqlen = runs[r].max_seqlen;
                const long long before = gdp_cuda_chunk_hopper_calls();
                gpu_run(gpu, &in, runs[r].with_desc, F32, &out);
                g_max_seqlen = 0;
                const long long ran = gdp_cuda_chunk_hopper_calls() - before;
                const int seg = ran > 0 ? gdp_cuda_chunk_hopper_last_segment() : 0;
                char w[200];
                snprintf(w, sizeof w, "%s, %s%s: %s (segments of %d; estimates staged %.0f, hopper %.0f, split %.0f us)",
                         c->name, runs[r].what, with_cs ? "" : ", no chunk states", ran > 0 ? "hopper" : "staged", seg,
                         want.staged_us, want.hopper_us, want.split_us);
                compare_runs(w, &in, &out, &ref, true);
                CHECK((ran > 0) == want_hopper && seg == want_seg,
                      "%s: the Hopper kernel ran %lld calls with segments of %d, expected %s with segments of %d on a "
                      "%d.%d device with %d SMs",
                      w, ran, seg, want_hopper ? "one" : "none", want_seg, major, minor, sms);
                if (want_seg > 0) { /* the same bits as the Hopper path forced to that segment length */
                    char len[16];
                    snprintf(len, sizeof len, "%d", want_seg);
                    set_chunk_path("hopper");
                    setenv("GDP_CHUNK_SEGMENT", len, 1);
                    outputs forced;
                    g_max_seqlen = runs[r].max_seqlen;
                    gpu_run(gpu, &in, runs[r].with_desc, F32, &forced);
                    g_max_seqlen = 0;
                    unsetenv("GDP_CHUNK_SEGMENT");
                    set_chunk_path(NULL);
                    CHECK(same_outputs(&out, &forced, g_with_cs),
                          "%s: outputs differ from GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=%d", w, want_seg);
                    free_outputs(&forced);
                }
                printf("  %s\n", w);
                free_outputs(&out);
            }
            g_with_cs = true;
        }
        free_outputs(&ref);
        free_inputs(&in);
    }
}

/* ---- cache mode with -1 rows, fp32 and bf16 cache; K = 128 with V = 64 and 128, K = 64 with V = 128 ---- */
static void test_cache(gdp_ctx_t cpu, gdp_ctx_t gpu, gdp_dtype_t cache_dtype, int k, int v) {
    /* request 1 is empty with a valid slot (its initial state goes back into the slot), request 3
     * has tokens but slot -1 (outputs computed, nothing stored), request 4 is padding */
    const chunk_case c = {"cache", 2, 2, k, v, 5, {70, 0, 130, 45, 0}, 300, GDP_DTYPE_BF16, GDP_DTYPE_BF16,
                          GDP_DTYPE_FP32, 1, 0, 0.1};
    const int32_t slots_v[5] = {6, 4, 1, -1, -1};
    const int64_t n_slots = 8;
    inputs in;
    make_inputs(&c, cache_dtype == GDP_DTYPE_FP32 ? 77 : 78, &in);
    test_rng r;
    test_rng_seed(&r, 5);
    int64_t cache_shape[4] = {n_slots, in.H, in.K, in.V}, idx_shape[1] = {in.N};
    gdp_tensor cache0 = test_tensor_alloc(cache_dtype, 4, cache_shape);
    test_fill_uniform(&cache0, &r, -0.5, 0.5);
    gdp_tensor slots = test_tensor_alloc(GDP_DTYPE_INT32, 1, idx_shape);
    memcpy(slots.data, slots_v, sizeof slots_v);
    /* gather: named slots' states as initial_state (the op never reads the cache), -1 rows random */
    const int64_t row_s = in.H * in.K * in.V;
    for (int64_t i = 0; i < in.N; i++)
        if (slots_v[i] >= 0)
            for (int64_t e = 0; e < row_s; e++)
                gdp_tensor_set(&in.init, i * row_s + e, gdp_tensor_get(&cache0, slots_v[i] * row_s + e));

    /* CPU */
    gdp_tensor cache_cpu = test_tensor_alloc(cache_dtype, 4, cache_shape);
    memcpy(cache_cpu.data, cache0.data, test_tensor_bytes(&cache0));
    int64_t o_shape[4] = {1, in.T, in.H, in.V}, cs_shape[4] = {in.num_chunks, in.H, in.K, in.V};
    outputs ref, out;
    memset(&ref, 0, sizeof ref);
    memset(&out, 0, sizeof out);
    ref.o = test_tensor_alloc(GDP_DTYPE_FP32, 4, o_shape);
    ref.cs = test_tensor_alloc(cache_dtype, 4, cs_shape);
    gdp_chunk_args a = base_args(&in);
    a.state = cache_cpu;
    a.state_indices = slots;
    a.o = ref.o;
    a.return_chunk_states = 1;
    a.chunk_states = ref.cs;
    CHECK_OK(gdp_chunk_gated_delta_product_varlen(cpu, &a));

    /* GPU */
    gdp_tensor d[10];
    const gdp_tensor *h[10] = {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.init, &in.cu, &in.ci, &in.cidp, &in.co};
    for (int i = 0; i < 10; i++)
        d[i] = test_dev_upload(h[i]);
    gdp_tensor d_cache = test_dev_upload(&cache0), d_slots = test_dev_upload(&slots);
    gdp_tensor d_o = test_dev_alloc(in.q.dtype, 4, o_shape, 0xff), d_cs = test_dev_alloc(cache_dtype, 4, cs_shape, 0x7f);
    gdp_chunk_args b = a;
    b.q = d[0]; b.k = d[1]; b.v = d[2]; b.g = d[3]; b.beta = d[4]; b.initial_state = d[5]; b.cu_seqlens = d[6];
    b.chunk_indices = d[7]; b.chunk_indices_dp = d[8]; b.chunk_offsets = d[9];
    b.state = d_cache;
    b.state_indices = d_slots;
    b.o = d_o;
    b.chunk_states = d_cs;
    if (!g_with_cs) {
        b.return_chunk_states = 0;
        memset(&b.chunk_states, 0, sizeof b.chunk_states);
    }
    reserve_for(gpu, in.T, in.N, in.M, in.H, in.K, in.V);
    char what[112];
    snprintf(what, sizeof what, "cache mode, V %d, %s cache, slots [6,4,1,-1,-1]%s", v, gdp_dtype_name(cache_dtype),
             g_with_cs ? "" : ", no chunk states");
    /* every state column-block width from the same cache: outputs and the whole cache bitwise equal */
    gdp_tensor cache_gpu;
    memset(&cache_gpu, 0, sizeof cache_gpu);
    for (int wi = 0; wi < 4; wi++) {
        upload_into(&d_cache, &cache0);
        CUDA_OK(cudaMemset(d_o.data, 0xff, test_tensor_bytes(&d_o)));
        CUDA_OK(cudaMemset(d_cs.data, 0x7f, test_tensor_bytes(&d_cs)));
        set_state_vb(STATE_VBS[wi]);
        CHECK_OK(gdp_chunk_gated_delta_product_varlen(gpu, &b));
        CUDA_OK(cudaDeviceSynchronize());
        outputs run;
        memset(&run, 0, sizeof run);
        run.o = test_dev_download(&d_o);
        if (g_with_cs)
            run.cs = test_dev_download(&d_cs);
        gdp_tensor cache_run = test_dev_download(&d_cache);
        if (wi == 0) {
            out = run;
            cache_gpu = cache_run;
            continue;
        }
        CHECK(same_outputs(&run, &out, false) && same_bytes(&cache_run, &cache_gpu),
              "%s: state VB %d gives o / chunk states / cache bytes different from VB %d", what, STATE_VBS[wi],
              STATE_VBS[0]);
        free_outputs(&run);
        test_host_free(&cache_run);
    }
    set_state_vb(0);
    compare_runs(what, &in, &out, &ref, false);
    const size_t es = gdp_dtype_size(cache_dtype), slot_bytes = (size_t)row_s * es;
    for (int64_t s = 0; s < n_slots; s++) {
        bool named = false;
        for (int64_t i = 0; i < in.N; i++)
            named = named || slots_v[i] == s;
        const char *g_slot = (char *)cache_gpu.data + s * slot_bytes;
        if (!named) {
            CHECK(memcmp(g_slot, (char *)cache0.data + s * slot_bytes, slot_bytes) == 0,
                  "%s: slot %lld, named by no request, changed", what, (long long)s);
            continue;
        }
        double *ga = calloc((size_t)row_s, sizeof(double)), *cb = calloc((size_t)row_s, sizeof(double));
        gdp_tensor_read_f64(&cache_gpu, s * row_s, row_s, ga);
        gdp_tensor_read_f64(&cache_cpu, s * row_s, row_s, cb);
        char w[128];
        snprintf(w, sizeof w, "%s: slot %lld", what, (long long)s);
        test_compare(w, ga, cb, row_s, REL_BAR, ELEM_TOL, ELEM_TOL);
        free(ga);
        free(cb);
    }
    /* the empty request with slot 4 stores its initial state unchanged */
    CHECK(memcmp((char *)cache_gpu.data + 4 * slot_bytes, (char *)cache0.data + 4 * slot_bytes, slot_bytes) == 0,
          "%s: the zero-length request did not store its initial state bit for bit", what);

    test_host_free(&cache_gpu);
    test_dev_free(&d_cache);
    test_dev_free(&d_slots);
    test_dev_free(&d_o);
    test_dev_free(&d_cs);
    for (int i = 0; i < 10; i++)
        test_dev_free(&d[i]);
    free_outputs(&ref);
    free_outputs(&out);
    test_host_free(&cache0);
    test_host_free(&cache_cpu);
    test_host_free(&slots);
    free_inputs(&in);
}

/* ---- padded vs unpadded: bitwise equal on real rows ----------------------------------------------- */
static gdp_tensor prefix(const gdp_tensor *t, int32_t dim, int64_t extent) {
    int64_t shape[GDP_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[dim] = extent;
    gdp_tensor c = test_tensor_alloc(t->dtype, t->ndim, shape);
    memcpy(c.data, t->data, test_tensor_bytes(&c)); /* leading dims are 1: a prefix of the bytes */
    return c;
}

static void test_padding(gdp_ctx_t gpu) {
    const chunk_case c = {"padded", 2, 2, 128, 128, 5, {100, 37, 200, 0, 0}, 400, GDP_DTYPE_BF16, GDP_DTYPE_BF16,
                          GDP_DTYPE_FP32, 1, 0, 0.1};
    inputs pad;
    make_inputs(&c, 4242, &pad);
    inputs un;
    memset(&un, 0, sizeof un);
    un = pad;
    un.T = 337;
    un.N = 3;
    un.q = prefix(&pad.q, 1, un.T);
    un.k = prefix(&pad.k, 1, un.T * un.M);
    un.v = prefix(&pad.v, 1, un.T * un.M);
    un.g = prefix(&pad.g, 1, un.T);
    un.beta = prefix(&pad.beta, 1, un.T * un.M);
    un.init = prefix(&pad.init, 0, un.N);
    un.cu = prefix(&pad.cu, 0, un.N + 1);
    build_descriptors(&un);
    outputs po, uo;
    gpu_run(gpu, &pad, true, GDP_DTYPE_FP32, &po);
    gpu_run(gpu, &un, true, GDP_DTYPE_FP32, &uo);
    const int64_t row_o = pad.H * pad.V, row_s = pad.H * pad.K * pad.V;
    const int64_t real_chunks = ((const int32_t *)un.co.data)[un.N];
    CHECK(memcmp(po.o.data, uo.o.data, (size_t)(un.T * row_o) * 2) == 0,
          "padded run: o on the %lld real rows differs from the unpadded run", (long long)un.T);
    CHECK(bytes_all((char *)po.o.data + un.T * row_o * 2, (size_t)((pad.T - un.T) * row_o) * 2, 0),
          "padded run: padding token rows are not exactly 0");
    CHECK(memcmp(po.fs.data, uo.fs.data, (size_t)(un.N * row_s) * sizeof(float)) == 0,
          "padded run: final states of the real requests differ from the unpadded run");
    CHECK(memcmp(po.cs.data, uo.cs.data, (size_t)(real_chunks * row_s) * sizeof(float)) == 0,
          "padded run: chunk states differ from the unpadded run");
    printf("  padded (T 400, N 5) vs unpadded (T 337, N 3): o, final and chunk states compared bit for bit\n");
    free_outputs(&po);
    free_outputs(&uo);
    gdp_tensor *own[] = {&un.q, &un.k, &un.v, &un.g, &un.beta, &un.init, &un.cu, &un.ci, &un.cidp, &un.co};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        test_host_free(own[i]);
    free_inputs(&pad);
}

/* ---- CUDA graph: capture with descriptors, replay with new data, equal to eager runs ------------------------ */
/* On the ctx's stream: the graph test's stream is non-blocking, so a legacy cudaMemcpy or
 * cudaMemset is not ordered with the replay (a pageable cudaMemcpy returns before its DMA
 * lands; docs/layer.md, "Streams and synchronization"). */
static void upload_on_stream(gdp_tensor *d, const gdp_tensor *h, cudaStream_t stream) {
    CHECK(test_tensor_bytes(d) == test_tensor_bytes(h), "graph test: buffer sizes differ");
    CUDA_OK(cudaMemcpyAsync(d->data, h->data, test_tensor_bytes(h), cudaMemcpyHostToDevice, stream));
}

static void test_graph(gdp_ctx_t cpu) {
    const chunk_case ca = {"graph A", 2, 4, 128, 128, 4, {100, 37, 200, 0}, 512, GDP_DTYPE_BF16, GDP_DTYPE_BF16,
                           GDP_DTYPE_FP32, 1, 0, 0.1};
    chunk_case cb = ca;
    cb.name = "graph B";
    cb.lens[0] = 64; cb.lens[1] = 150; cb.lens[2] = 90; cb.lens[3] = 130;
    inputs A, B;
    make_inputs(&ca, 31, &A);
    make_inputs(&cb, 32, &B);
    CHECK(A.num_chunks == B.num_chunks && A.num_chunks_dp == B.num_chunks_dp, "graph test: padded grids differ");

    gdp_ctx_t ctx;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CUDA, 0));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_OK(gdp_ctx_set_stream(ctx, stream));
    reserve_for(ctx, A.T, A.N, A.M, A.H, A.K, A.V);

    gdp_tensor d[10];
    const gdp_tensor *h[10] = {&A.q, &A.k, &A.v, &A.g, &A.beta, &A.init, &A.cu, &A.ci, &A.cidp, &A.co};
    for (int i = 0; i < 10; i++)
        d[i] = test_dev_upload(h[i]);
    int64_t o_shape[4] = {1, A.T, A.H, A.V}, s_shape[4] = {A.N, A.H, A.K, A.V}, cs_shape[4] = {A.num_chunks, A.H, A.K, A.V};
    gdp_tensor g_o = test_dev_alloc(GDP_DTYPE_BF16, 4, o_shape, 0xff), g_fs = test_dev_alloc(GDP_DTYPE_FP32, 4, s_shape, 0xff);
    gdp_tensor g_cs = test_dev_alloc(GDP_DTYPE_FP32, 4, cs_shape, 0x7f);
    gdp_tensor e_o = test_dev_alloc(GDP_DTYPE_BF16, 4, o_shape, 0xff), e_fs = test_dev_alloc(GDP_DTYPE_FP32, 4, s_shape, 0xff);
    gdp_tensor e_cs = test_dev_alloc(GDP_DTYPE_FP32, 4, cs_shape, 0x7f);
    /* the legacy-stream uploads and fills above have landed before the non-blocking stream runs */
    CUDA_OK(cudaDeviceSynchronize());
    gdp_chunk_args a;
    memset(&a, 0, sizeof a);
    a.q = d[0]; a.k = d[1]; a.v = d[2]; a.g = d[3]; a.beta = d[4]; a.initial_state = d[5]; a.cu_seqlens = d[6];
    a.chunk_indices = d[7]; a.chunk_indices_dp = d[8]; a.chunk_offsets = d[9];
    a.num_householder = A.M;
    a.use_qk_l2norm_in_kernel = 1;
    a.output_final_state = 1;
    a.return_chunk_states = g_with_cs;
    gdp_chunk_args ga = a, ea = a;
    ga.o = g_o; ga.final_state = g_fs;
    ea.o = e_o; ea.final_state = e_fs;
    if (g_with_cs) {
        ga.chunk_states = g_cs;
        ea.chunk_states = e_cs;
    }

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    gdp_status_t st = gdp_chunk_gated_delta_product_varlen(ctx, &ga);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CHECK(st == GDP_STATUS_SUCCESS, "capture: the op returned %s: %s", gdp_status_string(st), gdp_last_error());
    if (graph != NULL)
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    const inputs *sets[2] = {&A, &B};
    for (int round = 0; round < 2 && exec != NULL; round++) {
        const inputs *in = sets[round];
        const gdp_tensor *hs[10] = {&in->q, &in->k, &in->v, &in->g, &in->beta, &in->init, &in->cu, &in->ci, &in->cidp, &in->co};
        for (int i = 0; i < 10; i++)
            upload_on_stream(&d[i], hs[i], stream);
        CUDA_OK(cudaMemsetAsync(g_o.data, 0xff, test_tensor_bytes(&g_o), stream));
        CUDA_OK(cudaMemsetAsync(e_o.data, 0xff, test_tensor_bytes(&e_o), stream));
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        CHECK_OK(gdp_chunk_gated_delta_product_varlen(ctx, &ea));
        CUDA_OK(cudaStreamSynchronize(stream));
        outputs go = {test_dev_download(&g_o), test_dev_download(&g_fs), test_dev_download(&g_cs)};
        outputs eo = {test_dev_download(&e_o), test_dev_download(&e_fs), test_dev_download(&e_cs)};
        const int64_t real = ((const int32_t *)in->co.data)[in->N], row_s = in->H * in->K * in->V;
        CHECK(same_bytes(&go.o, &eo.o) && same_bytes(&go.fs, &eo.fs) &&
                  (!g_with_cs || memcmp(go.cs.data, eo.cs.data, (size_t)(real * row_s) * sizeof(float)) == 0),
              "graph replay %d (%s%s) differs from the eager run", round, in == &A ? "first data" : "new data",
              g_with_cs ? "" : ", no chunk states");
        if (!g_with_cs) { /* not asked: the comparison below skips them */
            test_host_free(&go.cs);
            test_host_free(&eo.cs);
        }
        outputs ref;
        inputs in_ref = *in;
        in_ref.scale = 0;
        in_ref.l2norm = 1;
        cpu_run(cpu, &in_ref, GDP_DTYPE_FP32, &ref);
        compare_runs(round == 0 ? "graph replay, first data" : "graph replay, new data and lengths", in, &go, &ref,
                     true);
        free_outputs(&ref);
        free_outputs(&go);
        free_outputs(&eo);
    }
    if (exec != NULL)
        cudaGraphExecDestroy(exec);
    if (graph != NULL)
        cudaGraphDestroy(graph);
    gdp_tensor *ds[] = {&g_o, &g_fs, &g_cs, &e_o, &e_fs, &e_cs};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        test_dev_free(ds[i]);
    for (int i = 0; i < 10; i++)
        test_dev_free(&d[i]);
    gdp_ctx_free(ctx);
    cudaStreamDestroy(stream);
    free_inputs(&A);
    free_inputs(&B);
}

/* ---- rejected calls write nothing ---------------------------------------------------------------------- */
/* The op under name=value refuses with INVALID_USAGE, naming both (the env is restored after). */
static void expect_env_refusal(gdp_ctx_t ctx, const gdp_chunk_args *a, const char *name, const char *value) {
    char *saved = test_env_swap(name, value);
    CHECK_STATUS(gdp_chunk_gated_delta_product_varlen(ctx, a), GDP_STATUS_INVALID_USAGE);
    CHECK(strstr(gdp_last_error(), name) != NULL && strstr(gdp_last_error(), value) != NULL,
          "the %s refusal names neither the variable nor its value: %s", name, gdp_last_error());
    printf("  %s=%s: %s\n", name, value, gdp_last_error());
    test_env_restore(name, saved);
}

static void test_rejections(void) {
    const chunk_case c = {"reject", 2, 2, 64, 64, 2, {40, 60}, 128, GDP_DTYPE_BF16, GDP_DTYPE_BF16, GDP_DTYPE_NUM,
                          1, 0, 0.1};
    inputs in;
    make_inputs(&c, 9, &in);
    gdp_ctx_t fresh;
    CHECK_OK(gdp_ctx_init(&fresh, GDP_BACKEND_CUDA, 0));
    gdp_tensor d[10];
    const gdp_tensor *h[10] = {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.init, &in.cu, &in.ci, &in.cidp, &in.co};
    for (int i = 0; i < 10; i++)
        d[i] = test_dev_upload(h[i]);
    int64_t o_shape[4] = {1, in.T, in.H, in.V};
    gdp_tensor d_o = test_dev_alloc(GDP_DTYPE_BF16, 4, o_shape, 0x5a);
    gdp_chunk_args a = base_args(&in);
    a.q = d[0]; a.k = d[1]; a.v = d[2]; a.g = d[3]; a.beta = d[4]; a.cu_seqlens = d[6];
    a.chunk_indices = d[7]; a.chunk_indices_dp = d[8]; a.chunk_offsets = d[9];
    a.o = d_o;
    /* descriptors given, nothing reserved: the op must not allocate */
    CHECK_STATUS(gdp_chunk_gated_delta_product_varlen(fresh, &a), GDP_STATUS_INVALID_USAGE);
    printf("  no workspace reserved: %s\n", gdp_last_error());

    /* fp32 q, k, v (and o) are not supported by the CUDA chunk op, as upstream */
    int64_t q_shape[4] = {1, in.T, in.H, in.K}, k_shape[4] = {1, in.T * in.M, in.H, in.K};
    int64_t v_shape[4] = {1, in.T * in.M, in.H, in.V};
    gdp_tensor q32 = test_dev_alloc(GDP_DTYPE_FP32, 4, q_shape, 0), k32 = test_dev_alloc(GDP_DTYPE_FP32, 4, k_shape, 0);
    gdp_tensor v32 = test_dev_alloc(GDP_DTYPE_FP32, 4, v_shape, 0), o32 = test_dev_alloc(GDP_DTYPE_FP32, 4, o_shape, 0x5a);
    reserve_for(fresh, in.T, in.N, in.M, in.H, in.K, in.V);
    gdp_chunk_args b = a;
    b.q = q32; b.k = k32; b.v = v32; b.o = o32;
    CHECK_STATUS(gdp_chunk_gated_delta_product_varlen(fresh, &b), GDP_STATUS_UNSUPPORTED);
    printf("  fp32 q: %s\n", gdp_last_error());
    /* an unknown value of each of the op's switches is refused before any launch, naming the
     * variable and the value, whatever path the test runs under */
    expect_env_refusal(fresh, &a, "GDP_CHUNK_STATE_VB", "48"); /* widths are 64, 32, 16 or 0 / unset */
    expect_env_refusal(fresh, &a, "GDP_CHUNK_PATH", "fastest");
    expect_env_refusal(fresh, &a, "GDP_CHUNK_HOPPER_COPY", "dma");
    expect_env_refusal(fresh, &a, "GDP_CHUNK_SEGMENT", "513"); /* 1 to 512, auto, off */
    expect_env_refusal(fresh, &a, "GDP_CHUNK_SEGMENT", "4x");
    expect_env_refusal(fresh, &a, "GDP_CHUNK_STATE_COPY", "dma");
    expect_env_refusal(fresh, &a, "GDP_CHUNK_WY_INVERSE", "fp16");
    CUDA_OK(cudaDeviceSynchronize());
    gdp_tensor ho = test_dev_download(&d_o), ho32 = test_dev_download(&o32);
    CHECK(bytes_all(ho.data, test_tensor_bytes(&ho), 0x5a) && bytes_all(ho32.data, test_tensor_bytes(&ho32), 0x5a),
          "a rejected call wrote its output");
    test_host_free(&ho);
    test_host_free(&ho32);
    gdp_tensor *ds[] = {&d_o, &q32, &k32, &v32, &o32};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++)
        test_dev_free(ds[i]);
    for (int i = 0; i < 10; i++)
        test_dev_free(&d[i]);
    gdp_ctx_free(fresh);
    free_inputs(&in);
}

/* ---- the profile's stage split (gdp/profile.h) under the current GDP_CHUNK_PATH ---------------------------- */
/* A profiled call gives the same bits; its stages are the staged chain's four, a one-kernel path's one,
 * or the Hopper split's three (its segment runs, fix-up and correction or second pass) exactly when the
 * split ran; they add up to no more than the profile's span; the CPU backend reports none. */
static void test_profile_stages(gdp_ctx_t cpu, gdp_ctx_t gpu, const char *path) {
    const chunk_case c = {"profile", 2, 4, 128, 128, 3, {300, 64, 130}, 512, GDP_DTYPE_BF16, GDP_DTYPE_BF16,
                          GDP_DTYPE_FP32, 1, 0, 0.1};
    inputs in;
    make_inputs(&c, 4242, &in);
    outputs plain, profiled, ref;
    gdp_phase_times pt;
    gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &plain);
    g_profile_times = &pt;
    const long long hopper_before = gdp_cuda_chunk_hopper_calls();
    gpu_run(gpu, &in, true, GDP_DTYPE_FP32, &profiled);
    const bool split_ran = gdp_cuda_chunk_hopper_calls() > hopper_before && gdp_cuda_chunk_hopper_last_segment() > 0;
    g_profile_times = NULL;
    CHECK(same_outputs(&plain, &profiled, true), "profile (%s): a profiled chunk call gives other bits", path);
    const double *s = pt.chunk_s;
    const bool no_split = s[GDP_CHUNK_STAGE_SPLIT_RUNS] == 0 && s[GDP_CHUNK_STAGE_SPLIT_FIXUP] == 0 &&
                          s[GDP_CHUNK_STAGE_SPLIT_CORRECT] == 0;
    const bool staged = s[GDP_CHUNK_STAGE_CUMSUM] > 0 && s[GDP_CHUNK_STAGE_WY] > 0 && s[GDP_CHUNK_STAGE_STATE] > 0 &&
                        s[GDP_CHUNK_STAGE_OUT] > 0 && s[GDP_CHUNK_STAGE_FUSED] == 0 && no_split;
    const bool fused = s[GDP_CHUNK_STAGE_FUSED] > 0 && s[GDP_CHUNK_STAGE_CUMSUM] == 0 && s[GDP_CHUNK_STAGE_WY] == 0 &&
                       s[GDP_CHUNK_STAGE_STATE] == 0 && no_split;
    const bool split = s[GDP_CHUNK_STAGE_SPLIT_RUNS] > 0 && s[GDP_CHUNK_STAGE_SPLIT_FIXUP] > 0 &&
                       s[GDP_CHUNK_STAGE_SPLIT_CORRECT] > 0 && s[GDP_CHUNK_STAGE_FUSED] == 0 &&
                       s[GDP_CHUNK_STAGE_CUMSUM] == 0 && s[GDP_CHUNK_STAGE_WY] == 0 && s[GDP_CHUNK_STAGE_STATE] == 0;
    double sum = 0;
    char stages[256] = "";
    for (int i = 0; i < GDP_CHUNK_STAGE_NUM; i++) {
        sum += s[i];
        const size_t used = strlen(stages);
        snprintf(stages + used, sizeof stages - used, " %s %.1f", gdp_chunk_stage_name((gdp_chunk_stage_t)i), s[i] * 1e6);
    }
    CHECK((int)staged + (int)fused + (int)split == 1,
          "profile (%s): stages (us)%s: not one of the staged, one-kernel or split patterns", path, stages);
    CHECK(strcmp(path, "staged") != 0 || staged, "profile (staged): the split is not the staged one");
    CHECK(strcmp(path, "fused") != 0 || fused, "profile (fused): the split is not the one-kernel one");
    CHECK(split == split_ran, "profile (%s): the Hopper split %s, stages (us)%s", path,
          split_ran ? "ran without its stages" : "did not run, yet its stages show", stages);
    CHECK(sum <= pt.total_s * (1 + 1e-6) && pt.ops_s <= pt.total_s * (1 + 1e-6),
          "profile (%s): the stages add up to %g s, past the profile's span %g s", path, sum, pt.total_s);
    /* the CPU backend has no stages: a profiled CPU call leaves them 0 */
    gdp_phase_times cpt;
    CHECK_OK(gdp_profile_begin(cpu));
    cpu_run(cpu, &in, GDP_DTYPE_FP32, &ref);
    CHECK_OK(gdp_profile_end(cpu, &cpt));
    for (int i = 0; i < GDP_CHUNK_STAGE_NUM; i++)
        CHECK(cpt.chunk_s[i] == 0, "profile: the CPU backend reports a %s stage of %g s",
              gdp_chunk_stage_name((gdp_chunk_stage_t)i), cpt.chunk_s[i]);
    CHECK(gdp_chunk_stage_name(GDP_CHUNK_STAGE_NUM) == NULL, "gdp_chunk_stage_name names a stage past the last");
    printf("  profile (%s): stages (us)%s (span %.1f us); profiled call bitwise equal\n", path, stages,
           pt.total_s * 1e6);
    free_outputs(&plain);
    free_outputs(&profiled);
    free_outputs(&ref);
    free_inputs(&in);
}

/* ---- the chunk-local cumsum op ---------------------------------------------------------------------------- */
static void test_cumsum(gdp_ctx_t cpu, gdp_ctx_t gpu) {
    const chunk_case c = {"cumsum", 3, 5, 64, 64, 5, {130, 0, 64, 1, 200}, 420, GDP_DTYPE_BF16, GDP_DTYPE_BF16,
                          GDP_DTYPE_NUM, 1, 0, 1.0};
    inputs in;
    make_inputs(&c, 11, &in);
    int64_t q_shape[3] = {1, in.T, in.H}, k_shape[3] = {1, in.T * in.M, in.H};
    gdp_tensor cq = test_tensor_alloc(GDP_DTYPE_FP32, 3, q_shape), ck = test_tensor_alloc(GDP_DTYPE_FP32, 3, k_shape);
    CHECK_OK(gdp_chunk_local_cumsum(cpu, &cq, &ck, &in.g, &in.cu, in.M));
    gdp_tensor dg = test_dev_upload(&in.g), dcu = test_dev_upload(&in.cu);
    gdp_tensor dq = test_dev_alloc(GDP_DTYPE_FP32, 3, q_shape, 0xff), dk = test_dev_alloc(GDP_DTYPE_FP32, 3, k_shape, 0xff);
    CHECK_OK(gdp_chunk_local_cumsum(gpu, &dq, &dk, &dg, &dcu, in.M));
    CUDA_OK(cudaDeviceSynchronize());
    gdp_tensor gq = test_dev_download(&dq), gk = test_dev_download(&dk);
    /* fp32 sums of at most 64 same-signed terms: relative error below 64 fp32 ulps */
    double *a = test_tensor_f64(&gq), *b = test_tensor_f64(&cq);
    test_compare("cumsum token stream", a, b, in.T * in.H, 1e-6, 1e-6, 1e-5);
    free(a);
    free(b);
    a = test_tensor_f64(&gk);
    b = test_tensor_f64(&ck);
    test_compare("cumsum expanded stream", a, b, in.T * in.M * in.H, 1e-6, 1e-6, 1e-5);
    free(a);
    free(b);
    const int64_t end = ((const int32_t *)in.cu.data)[in.N];
    CHECK(bytes_all((float *)gq.data + end * in.H, (size_t)((in.T - end) * in.H) * 4, 0) &&
              bytes_all((float *)gk.data + end * in.M * in.H, (size_t)((in.T - end) * in.M * in.H) * 4, 0),
          "cumsum rows past cu_seqlens[N] are not 0");
    /* one stream at a time (the launch then holds only that stream's blocks): the same bits */
    CUDA_OK(cudaMemset(dq.data, 0xff, (size_t)(in.T * in.H) * 4));
    CUDA_OK(cudaMemset(dk.data, 0xff, (size_t)(in.T * in.M * in.H) * 4));
    CHECK_OK(gdp_chunk_local_cumsum(gpu, NULL, &dk, &dg, &dcu, in.M));
    CHECK_OK(gdp_chunk_local_cumsum(gpu, &dq, NULL, &dg, &dcu, in.M));
    CUDA_OK(cudaDeviceSynchronize());
    gdp_tensor gq1 = test_dev_download(&dq), gk1 = test_dev_download(&dk);
    CHECK(memcmp(gq1.data, gq.data, (size_t)(in.T * in.H) * 4) == 0 &&
              memcmp(gk1.data, gk.data, (size_t)(in.T * in.M * in.H) * 4) == 0,
          "cumsum: each stream alone differs from both in one call");
    test_host_free(&gq1), test_host_free(&gk1);
    printf("  chunk-local cumsums (M=3, lengths 130,0,64,1,200, 20 padded rows) vs the CPU backend; each stream "
           "alone the same bits\n");
    gdp_tensor *hs[] = {&cq, &ck, &gq, &gk};
    for (size_t i = 0; i < 4; i++)
        test_host_free(hs[i]);
    gdp_tensor *ds[] = {&dg, &dcu, &dq, &dk};
    for (size_t i = 0; i < 4; i++)
        test_dev_free(ds[i]);
    free_inputs(&in);
}

/* Under GDP_CHUNK_PATH=hopper the cases with K and V each 64 or 128 (golden files, random shapes,
 * the cache cases) must have run the Hopper kernel on a compute capability 9.0 device, and nothing may
 * have run it elsewhere (its code is sm_90a only). */
static bool hopper_device(int *major, int *minor) {
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && *major == 9 &&
           *minor == 0;
}
static void check_hopper_ran(long long before) {
    int major = 0, minor = 0;
    const bool hopper = hopper_device(&major, &minor);
    const long long ran = gdp_cuda_chunk_hopper_calls() - before;
    printf("  the Hopper kernel ran %lld calls (device %d.%d)\n", ran, major, minor);
    CHECK(hopper ? ran > 0 : ran == 0, "GDP_CHUNK_PATH=hopper on a %d.%d device: the Hopper kernel ran %lld calls",
          major, minor, ran);
}

/* The cache cases' (K, V): the Hopper kernel's two row-block layouts of the state (K = 128: a
 * warpgroup's 64 key rows; K = 64: its value columns) and V = 64 and 128. */
static const int CACHE_KV[3][2] = {{128, 64}, {128, 128}, {64, 128}};

int main(void) {
    if (!test_gpu_present("test_chunk_gpu"))
        return TEST_SKIP;
    gdp_ctx_t cpu, gpu;
    CHECK_OK(gdp_ctx_init(&cpu, GDP_BACKEND_CPU, 0));
    CHECK_OK(gdp_ctx_init(&gpu, GDP_BACKEND_CUDA, 0));
    set_state_vb(0); /* the op's own choice unless a test sets the width */
    /* every case under each kernel path: the staged chain, the fused kernel (shapes it does not
     * take, K or V above 128, run staged there too), and the op's own choice */
    static const char *const paths[4] = {"staged", "fused", "hopper", NULL};
    /* GDP_TEST_CHUNK_PATH=staged|fused|hopper|auto runs that path only (the sanitizer runs, which
     * are slow, take one path per call) */
    const char *only = getenv("GDP_TEST_CHUNK_PATH");
    /* GDP_TEST_CHUNK_ONLY=segments: on the Hopper path, the segment split's cases alone (test_hopper_segments
     * and the cache and graph cases under segments of two): racecheck of the split's kernels fits a device
     * call then (the whole hopper path under racecheck takes longer than one) */
    const char *only_cases = getenv("GDP_TEST_CHUNK_ONLY");
    const bool segments_only = only_cases != NULL && strcmp(only_cases, "segments") == 0;
    if (only_cases != NULL && *only_cases != '\0' && !segments_only) {
        fprintf(stderr, "test_chunk_gpu: GDP_TEST_CHUNK_ONLY is \"%s\"; it takes segments (or unset)\n", only_cases);
        return 2;
    }
    for (int pi = 0; pi < 4; pi++) {
        if (only != NULL && *only != '\0' && strcmp(only, paths[pi] != NULL ? paths[pi] : "auto") != 0)
            continue;
        if (segments_only && (paths[pi] == NULL || strcmp(paths[pi], "hopper") != 0))
            continue;
        set_chunk_path(paths[pi]);
        printf("== GDP_CHUNK_PATH=%s\n", paths[pi] != NULL ? paths[pi] : "(unset: auto)");
        const long long hopper_before = gdp_cuda_chunk_hopper_calls();
        if (!segments_only) {
            test_golden(gpu);
            test_random(cpu, gpu);
            if (pi == 0) { /* the staged sweep's column blocks; the fused kernel has one width */
                test_state_widths(cpu, gpu);
                /* WY's inverse on CUDA cores in fp32 (the default puts its off-diagonal products on
                 * tf32 tensor cores): other bits, the same bars against the references */
                setenv("GDP_CHUNK_WY_INVERSE", "fp32", 1);
                printf("== GDP_CHUNK_WY_INVERSE=fp32 (staged)\n");
                test_golden(gpu);
                test_random(cpu, gpu);
                unsetenv("GDP_CHUNK_WY_INVERSE");
            }
            printf("cache mode, padding, graphs, rejections:\n");
            for (int kv = 0; kv < 3; kv++) {
                test_cache(cpu, gpu, GDP_DTYPE_FP32, CACHE_KV[kv][0], CACHE_KV[kv][1]);
                test_cache(cpu, gpu, GDP_DTYPE_BF16, CACHE_KV[kv][0], CACHE_KV[kv][1]);
            }
            test_padding(gpu);
            test_graph(cpu);
            test_rejections();
            test_profile_stages(cpu, gpu, paths[pi] != NULL ? paths[pi] : "auto");
            if (paths[pi] == NULL)
                test_auto_choice(cpu, gpu);
        }
        if (paths[pi] != NULL && strcmp(paths[pi], "hopper") == 0) {
            if (!segments_only)
                test_hopper_copies(cpu, gpu);
            int major = 0, minor = 0;
            test_hopper_segments(cpu, gpu, hopper_device(&major, &minor));
            /* the cache cases and the graph replay with every sequence cut into segments of two chunks,
             * with chunk states (the split's second pass) and without (its outputs' correction, the
             * serving path's: the layer never asks for chunk states) */
            setenv("GDP_CHUNK_SEGMENT", "2", 1);
            for (int with_cs = 1; with_cs >= 0; with_cs--) {
                printf("== GDP_CHUNK_SEGMENT=2 (hopper), %s: cache mode, graphs\n",
                       with_cs ? "chunk states" : "no chunk states");
                g_with_cs = with_cs != 0;
                for (int kv = 0; kv < 3; kv++) {
                    test_cache(cpu, gpu, GDP_DTYPE_FP32, CACHE_KV[kv][0], CACHE_KV[kv][1]);
                    test_cache(cpu, gpu, GDP_DTYPE_BF16, CACHE_KV[kv][0], CACHE_KV[kv][1]);
                }
                test_graph(cpu);
                test_profile_stages(cpu, gpu, with_cs ? "hopper, segments of 2" : "hopper, segments of 2, no chunk states");
            }
            g_with_cs = true;
            unsetenv("GDP_CHUNK_SEGMENT");
            check_hopper_ran(hopper_before);
        }
    }
    set_chunk_path(NULL);
    if (!segments_only)
        test_cumsum(cpu, gpu);
    gdp_ctx_free(gpu);
    gdp_ctx_free(cpu);
    return test_finish("test_chunk_gpu");
}

#else /* !GDP_HAVE_CUDA */

int main(void) {
    printf("test_chunk_gpu: skipped, this libgdp was built without the CUDA backend\n");
    return TEST_SKIP;
}

#endif
