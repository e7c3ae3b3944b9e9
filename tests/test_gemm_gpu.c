/*
 * test_gemm_gpu.c: the CUDA projection GEMM (src/backend.h gdp_gemm_nt_ex) on both of its
 * paths, the skinny kernel for a few rows (kernels/gemv.h, GDP_GEMM_SKINNY=on) and cuBLASLt
 * (GDP_GEMM_SKINNY=off), against a double-precision host product. Checked on random shapes
 * (rows 1 to 16 across the skinny limit, n odd and large, k from 8 to 4096, row pitches wider
 * than k, bf16 and fp16 operands, fp32 and 16-bit C, beta 0 and 1):
 *   - every element within the fp32 accumulation bound (k + 8) 2^-24 sum |a b| (+ one ulp of a
 *     16-bit C), NaN never passes; at beta 0 C starts as NaN (C must not be read);
 *   - C's pitch gap (columns n .. ldc) untouched;
 *   - the skinny kernel twice on the same inputs: the same bits;
 *   - GDP_GEMM_SKINNY=auto (the default) gives the skinny kernel's bits up to GDP_GEMV_AUTO_ROWS
 *     rows where it fits, cuBLASLt's beyond (a deterministic cuBLASLt plan: the same bits twice);
 *   - shapes the skinny kernel does not take (k % 8 != 0, a misaligned pitch) still run (cuBLASLt);
 *   - the split-k kernel (kernels/gemm_splitk.h, GDP_GEMM_SPLITK=on) on the decode step's projections
 *     (64 to 256 rows of in_proj and out_proj) and on partial tiles: within the bound, twice the same
 *     bits, cuBLASLt's bits where it does not take the call, and auto takes it from 3 rows;
 *   - GDP_GEMM_SKINNY with an unknown value is refused naming the variable and the value.
 * And the norm-GEMMs (src/decode_core.h gdp_norm_gemm: the pre-RMSNorm with in_proj, the gated
 * RMSNorm with out_proj), each in one launch (kernels/gemv.h, the norm-GEMV), on the layer's
 * shapes and random ones (rows 1 to 12, x fp32 or bf16, y and z row views, C fp32 or bf16):
 *   - the one launch, with and without programmatic dependent launch (GDP_NORM_GEMM=pdl, serial),
 *     gives the bits of the norm op followed by the skinny kernel (GDP_NORM_GEMM=chain,
 *     GDP_GEMM_SKINNY=on), and its C is within the accumulation bound of the double product of
 *     the norm's output; auto takes it for the gated norm at up to 2 rows, with the same bits;
 *   - captured in a graph (pdl) after a kernel that writes its input, replayed with new inputs:
 *     the same bits as the eager chain on those inputs (the launch waits for the writer);
 *   - past the kernel's row limit it runs the chain; an unknown GDP_NORM_GEMM is refused.
 * Without a CUDA build or a visible GPU it prints why and exits 77 (skip).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "decode_core.h"
#include "internal.h"
#include "kernels/gemm_splitk.h"
#include "kernels/gemv.h"
#include "test_gpu.h"

#ifdef GDP_HAVE_CUDA

typedef struct gemm_case {
    int64_t rows, n, k, lda_pad, ldc_pad;
    gdp_dtype_t ab, c;
    float beta;
} gemm_case;

/* One run of the GEMM on device copies of a, b and c0 under GDP_GEMM_SKINNY=mode and
 * GDP_GEMM_SPLITK=splitk; the host C. *ways (may be NULL): the split-k kernel's ways for these
 * device operands (0: it does not take them). */
static gdp_tensor run_gemm(const gemm_case *cs, const char *mode, const char *splitk, const gdp_tensor *a,
                           const gdp_tensor *b, const gdp_tensor *c0, int *ways) {
    gdp_tensor da = test_dev_upload(a), db = test_dev_upload(b), dc = test_dev_upload(c0);
    const int64_t lda = cs->k + cs->lda_pad, ldc = cs->n + cs->ldc_pad;
    if (ways != NULL)
        *ways = gdp_cuda_gemm_splitk_ways(g_test_gpu, cs->rows, cs->n, cs->k, da.data, lda, db.data, cs->ab, dc.data,
                                          ldc, cs->c);
    char *saved = test_env_swap("GDP_GEMM_SKINNY", mode);
    char *saved_splitk = test_env_swap("GDP_GEMM_SPLITK", splitk);
    CHECK_OK(gdp_gemm_nt_ex(g_test_gpu, cs->rows, cs->n, cs->k, da.data, lda, db.data, cs->ab, cs->beta, dc.data, ldc,
                            cs->c));
    test_env_restore("GDP_GEMM_SPLITK", saved_splitk);
    test_env_restore("GDP_GEMM_SKINNY", saved);
    CUDA_OK(cudaStreamSynchronize(g_test_stream));
    gdp_tensor out = test_dev_download(&dc);
    test_dev_free(&da), test_dev_free(&db), test_dev_free(&dc);
    return out;
}

/* got vs the double product: the accumulation bound, the pitch gap untouched. */
static void check_gemm(const char *what, const gemm_case *cs, const gdp_tensor *got, const double *a, const double *b,
                       const double *c0) {
    const int64_t lda = cs->k + cs->lda_pad, ldc = cs->n + cs->ldc_pad;
    const double *g = test_tensor_f64(got);
    const double gamma = (double)(cs->k + 8) * ldexp(1.0, -24);
    int64_t bad = 0, gap = 0, first = -1;
    double worst = 0.0;
    for (int64_t r = 0; r < cs->rows; r++) {
        for (int64_t j = 0; j < cs->n; j++) {
            double ref = 0.0, mag = 0.0;
            for (int64_t i = 0; i < cs->k; i++) {
                ref += a[r * lda + i] * b[j * cs->k + i];
                mag += fabs(a[r * lda + i] * b[j * cs->k + i]);
            }
            if (cs->beta != 0.0f) {
                ref += (double)cs->beta * c0[r * ldc + j];
                mag += fabs((double)cs->beta * c0[r * ldc + j]);
            }
            const double tol = gamma * mag + test_ulp_at(cs->c, ref) + 1e-30;
            const double d = fabs(g[r * ldc + j] - ref);
            if (!(d <= tol)) {
                if (first < 0)
                    first = r * ldc + j;
                bad++;
            }
            if (d / tol > worst)
                worst = d / tol;
        }
        for (int64_t j = cs->n; j < ldc; j++) /* the gap keeps its bits (both are NaN-free there) */
            gap += g[r * ldc + j] != c0[r * ldc + j];
    }
    CHECK(bad == 0, "%s: rows %lld n %lld k %lld: %lld elements outside the bound, first at %lld (got %g)", what,
          (long long)cs->rows, (long long)cs->n, (long long)cs->k, (long long)bad, (long long)first,
          first >= 0 ? g[first] : 0.0);
    CHECK(gap == 0, "%s: %lld elements of C's pitch gap were written", what, (long long)gap);
    printf("  %-8s rows %2lld n %5lld k %4lld lda+%lld ldc+%lld %s->%s beta %g: worst |diff| / bound %.3f\n", what,
           (long long)cs->rows, (long long)cs->n, (long long)cs->k, (long long)cs->lda_pad, (long long)cs->ldc_pad,
           gdp_dtype_name(cs->ab), gdp_dtype_name(cs->c), (double)cs->beta, worst);
    free((void *)g);
}

static void gemm_one(const gemm_case *cs, test_rng *rng) {
    const int64_t lda = cs->k + cs->lda_pad, ldc = cs->n + cs->ldc_pad;
    const int64_t sa[2] = {cs->rows, lda}, sb[2] = {cs->n, cs->k}, sc[2] = {cs->rows, ldc};
    gdp_tensor a = test_tensor_alloc(cs->ab, 2, sa), b = test_tensor_alloc(cs->ab, 2, sb);
    gdp_tensor c0 = test_tensor_alloc(cs->c, 2, sc);
    test_fill_uniform(&a, rng, -1.0, 1.0);
    test_fill_uniform(&b, rng, -1.0, 1.0);
    test_fill_uniform(&c0, rng, -4.0, 4.0);
    if (cs->beta == 0.0f) /* C is not read at beta 0: NaN there must not leak; the gap stays finite */
        for (int64_t r = 0; r < cs->rows; r++)
            for (int64_t j = 0; j < cs->n; j++)
                gdp_tensor_set(&c0, r * ldc + j, NAN);
    double *ha = test_tensor_f64(&a), *hb = test_tensor_f64(&b), *hc = test_tensor_f64(&c0);
    /* what gdp_cuda_gemv_fits asks of these operands (device copies are 256-byte aligned) */
    const int fits = cs->rows <= GDP_GEMV_MAX_ROWS && cs->k % 8 == 0 && lda % 8 == 0;
    int ways = 0;
    gdp_tensor skinny = run_gemm(cs, "on", "off", &a, &b, &c0, NULL), blas = run_gemm(cs, "off", "off", &a, &b, &c0, NULL);
    gdp_tensor split = run_gemm(cs, "off", "on", &a, &b, &c0, &ways);
    check_gemm(fits ? "skinny" : "fallback", cs, &skinny, ha, hb, hc);
    check_gemm("cublasLt", cs, &blas, ha, hb, hc);
    if (ways >= 2) {
        char what[32];
        snprintf(what, sizeof what, "splitk%d", ways);
        check_gemm(what, cs, &split, ha, hb, hc);
        gdp_tensor again = run_gemm(cs, "off", "on", &a, &b, &c0, NULL);
        test_same_bytes("split-k GEMM twice", &split, &again);
        test_host_free(&again);
    } else { /* it does not take them: GDP_GEMM_SPLITK=on runs cuBLASLt */
        test_same_bytes("split-k not taken = cublasLt", &split, &blas);
    }
    if (fits) {
        gdp_tensor again = run_gemm(cs, "on", "off", &a, &b, &c0, NULL);
        test_same_bytes("skinny GEMM twice", &skinny, &again);
        test_host_free(&again);
    }
    /* auto for both switches (GDP_GEMM_SKINNY's default; GDP_GEMM_SPLITK is off when unset) takes the
     * skinny kernel up to GDP_GEMV_AUTO_ROWS rows, the split-k kernel from GDP_GEMM_SPLITK_AUTO_MIN_ROWS
     * where it splits, cuBLASLt elsewhere: its bits are those of the path it names */
    const bool auto_skinny = fits && cs->rows <= GDP_GEMV_AUTO_ROWS;
    const bool auto_split = !auto_skinny && ways >= 2 && cs->rows >= GDP_GEMM_SPLITK_AUTO_MIN_ROWS;
    gdp_tensor chosen = run_gemm(cs, "auto", "auto", &a, &b, &c0, NULL);
    test_same_bytes(auto_skinny ? "auto = skinny" : auto_split ? "auto = split-k" : "auto = cublasLt", &chosen,
                    auto_skinny ? &skinny : auto_split ? &split : &blas);
    test_host_free(&chosen);
    free(ha), free(hb), free(hc);
    test_host_free(&a), test_host_free(&b), test_host_free(&c0), test_host_free(&skinny), test_host_free(&blas);
    test_host_free(&split);
}


/* ---- the norm-GEMMs ---- */

typedef struct norm_gemm_case {
    int64_t rows, k, group, n; /* group 0: the pre-RMSNorm; else the gated norm's groups   */
    int64_t x_pad, z_pad;      /* row views: extra elements a row of x (y) and of z         */
    gdp_dtype_t x, c;
    float beta;
} norm_gemm_case;

/* x is the first k columns of x_full = l2norm(x_src), [rows, k + x_pad]: a kernel writes the
 * norm-GEMM's input, and x is a row view where x_pad > 0. */
typedef struct norm_gemm_dev {
    gdp_tensor x_src, x_full, x, z, w, out, B, C;
    gdp_norm_gemm_args args;
} norm_gemm_dev;

/* The writer, then the norm-GEMM. */
static gdp_status_t norm_gemm_after_writer(void *p) {
    norm_gemm_dev *d = p;
    GDP_CHECK(gdp_l2norm(g_test_gpu, &d->x_full, &d->x_src));
    return gdp_norm_gemm(g_test_gpu, &d->args);
}

/* The host inputs of one case: x_src, z, the norm weight, B and C0. */
typedef struct norm_gemm_host {
    gdp_tensor x_src, z, w, B, C0;
} norm_gemm_host;

static norm_gemm_host norm_gemm_host_make(const norm_gemm_case *cs, test_rng *rng) {
    const bool gated = cs->group > 0;
    const int64_t sx[2] = {cs->rows, cs->k}, sxf[2] = {cs->rows, cs->k + cs->x_pad}, sw[1] = {cs->k},
                  sb[2] = {cs->n, cs->k}, sc[2] = {cs->rows, cs->n};
    norm_gemm_host h;
    h.x_src = test_tensor_alloc(cs->x, 2, sxf);
    test_fill_uniform(&h.x_src, rng, -3.0, 3.0);
    h.z = test_alloc_rows(GDP_DTYPE_BF16, 2, sx, cs->z_pad);
    test_fill_uniform(&h.z, rng, -4.0, 4.0);
    if (!gated)
        h.z.data = (free(h.z.data), NULL);
    h.w = test_tensor_alloc(GDP_DTYPE_BF16, 1, sw);
    test_fill_uniform(&h.w, rng, 0.5, 1.5);
    h.B = test_tensor_alloc(GDP_DTYPE_BF16, 2, sb);
    test_fill_uniform(&h.B, rng, -1.0, 1.0);
    h.C0 = test_tensor_alloc(cs->c, 2, sc);
    test_fill_uniform(&h.C0, rng, -4.0, 4.0);
    if (cs->beta == 0.0f)
        test_fill_nan(&h.C0); /* C is not read at beta 0 */
    return h;
}

static void norm_gemm_host_free(norm_gemm_host *h) {
    test_host_free(&h->x_src), test_host_free(&h->z), test_host_free(&h->w), test_host_free(&h->B),
        test_host_free(&h->C0);
}

/* args points into *d. */
static void norm_gemm_dev_make(norm_gemm_dev *d, const norm_gemm_case *cs, const norm_gemm_host *h) {
    const int64_t so[2] = {cs->rows, cs->k};
    d->x_src = test_dev_upload(&h->x_src);
    d->x_full = test_dev_upload(&h->x_src);
    d->x = d->x_full;
    d->x.shape[1] = cs->k; /* the row view: x_full's row stride */
    d->z = test_dev_clone(&h->z);
    d->w = test_dev_upload(&h->w);
    d->out = test_dev_alloc(GDP_DTYPE_BF16, 2, so, 0);
    d->B = test_dev_upload(&h->B);
    d->C = test_dev_upload(&h->C0);
    d->args = (gdp_norm_gemm_args){.out = &d->out, .x = &d->x, .z = cs->group > 0 ? &d->z : NULL, .weight = &d->w,
                                   .group_size = cs->group, .eps = 1e-6, .n = cs->n, .B = d->B.data,
                                   .beta = cs->beta, .C = d->C.data, .ldc = cs->n, .c_dtype = cs->c};
}

static void norm_gemm_dev_free(norm_gemm_dev *d) {
    test_dev_free(&d->x_src), test_dev_free(&d->x_full), test_dev_free(&d->z), test_dev_free(&d->w),
        test_dev_free(&d->out), test_dev_free(&d->B), test_dev_free(&d->C);
}

/* One eager call (writer then norm-GEMM) under GDP_NORM_GEMM=mode and GDP_GEMM_SKINNY=skinny:
 * C, and the norm's output in *normed when the chain ran (NULL: not wanted). */
static gdp_tensor norm_gemm_run(const norm_gemm_case *cs, const norm_gemm_host *h, const char *mode, const char *skinny,
                                bool *fused, gdp_tensor *normed) {
    norm_gemm_dev d;
    norm_gemm_dev_make(&d, cs, h);
    char *saved_mode = test_env_swap("GDP_NORM_GEMM", mode), *saved_skinny = test_env_swap("GDP_GEMM_SKINNY", skinny);
    CHECK_OK(gdp_l2norm(g_test_gpu, &d.x_full, &d.x_src));
    if (fused != NULL)
        *fused = gdp_norm_gemm_fuses(g_test_gpu, &d.args);
    CHECK_OK(gdp_norm_gemm(g_test_gpu, &d.args));
    test_env_restore("GDP_GEMM_SKINNY", saved_skinny), test_env_restore("GDP_NORM_GEMM", saved_mode);
    CUDA_OK(cudaStreamSynchronize(g_test_stream));
    gdp_tensor c = test_dev_download(&d.C);
    if (normed != NULL)
        *normed = test_dev_download(&d.out);
    norm_gemm_dev_free(&d);
    return c;
}

static void norm_gemm_one(const norm_gemm_case *cs, test_rng *rng) {
    /* auto takes the one launch for the gated norm at up to 2 rows (decode_core.h), serial and pdl up
     * to the kernel's limit */
    /* the one launch's scope (kernels/gemv.h): at most GDP_GEMV_MAX_ROWS rows and a norm vector on the
     * norm's fast path with at most two 8-element chunks a thread (a warp up to 1024 elements, a block
     * of 256 threads above: so not 513 to 1024; the random cases draw such RMS rows) */
    const int64_t vec = cs->group > 0 ? cs->group : cs->k;
    const bool gated = cs->group > 0, fits = cs->rows <= GDP_GEMV_MAX_ROWS && (vec <= 512 || vec > 1024),
               auto_fits = gated && fits && cs->rows <= 2;
    const char *what = gated ? "gated" : "rms";
    norm_gemm_host h = norm_gemm_host_make(cs, rng);
    bool auto_fused = false, fused = false, pdl_fused = false, chain_fused = true;
    gdp_tensor normed;
    gdp_tensor c_auto = norm_gemm_run(cs, &h, "auto", "on", &auto_fused, NULL);
    gdp_tensor c_fused = norm_gemm_run(cs, &h, "serial", "off", &fused, NULL);
    gdp_tensor c_pdl = norm_gemm_run(cs, &h, "pdl", "off", &pdl_fused, NULL);
    gdp_tensor c_chain = norm_gemm_run(cs, &h, "chain", "on", &chain_fused, &normed);
    CHECK(auto_fused == auto_fits && fused == fits && pdl_fused == fits && !chain_fused,
          "%s rows %lld: the one launch ran %d / %d / %d / %d (auto / serial / pdl / chain), expected %d / %d", what,
          (long long)cs->rows, auto_fused, fused, pdl_fused, chain_fused, auto_fits, fits);
    /* where neither takes the one launch within the skinny kernel's rows, serial ran the chain on cuBLASLt
     * (GDP_GEMM_SKINNY=off) and the chain the skinny kernel: other sums, each checked against the bound below */
    if (fits || cs->rows > GDP_GEMV_MAX_ROWS) {
        test_same_bytes(gated ? "gated norm-GEMM, one launch vs the chain" : "rms norm-GEMM, one launch vs the chain",
                        &c_fused, &c_chain);
        test_same_bytes(gated ? "gated norm-GEMM, with and without PDL" : "rms norm-GEMM, with and without PDL",
                        &c_fused, &c_pdl);
    }
    test_same_bytes(gated ? "gated norm-GEMM, auto vs the chain" : "rms norm-GEMM, auto vs the chain", &c_auto,
                    &c_chain);
    /* the product against the double product of the norm's (chain) output */
    const gemm_case gc = {cs->rows, cs->n, cs->k, 0, 0, GDP_DTYPE_BF16, cs->c, cs->beta};
    double *ha = test_tensor_f64(&normed), *hb = test_tensor_f64(&h.B), *hc = test_tensor_f64(&h.C0);
    check_gemm(fits ? (gated ? "gated-1" : "rms-1") : (gated ? "gated-ch" : "rms-ch"), &gc, &c_fused, ha, hb, hc);
    free(ha), free(hb), free(hc);

    /* graph capture after the writer, replayed with new inputs */
    norm_gemm_dev d;
    norm_gemm_dev_make(&d, cs, &h);
    char *saved_mode = test_env_swap("GDP_NORM_GEMM", "pdl"); /* the programmatic edge after the writer */
    cudaGraphExec_t exec = test_graph_capture(norm_gemm_after_writer, &d);
    test_env_restore("GDP_NORM_GEMM", saved_mode);
    CHECK(exec != NULL, "%s rows %lld: the norm-GEMM did not capture", what, (long long)cs->rows);
    if (exec != NULL) {
        test_fill_uniform(&h.x_src, rng, -2.0, 2.0);
        if (gated)
            test_fill_uniform(&h.z, rng, -4.0, 4.0);
        test_dev_put(&d.x_src, &h.x_src);
        if (gated)
            test_dev_put(&d.z, &h.z);
        test_dev_put(&d.C, &h.C0);
        test_graph_replay(exec);
        gdp_tensor c_graph = test_dev_download(&d.C), normed2;
        gdp_tensor c_ref = norm_gemm_run(cs, &h, "chain", "on", NULL, &normed2);
        test_same_bytes(gated ? "gated norm-GEMM, graph replay vs the chain" : "rms norm-GEMM, graph replay vs the chain",
                        &c_graph, &c_ref);
        CUDA_OK(cudaGraphExecDestroy(exec));
        test_host_free(&c_graph), test_host_free(&c_ref), test_host_free(&normed2);
    }
    norm_gemm_dev_free(&d);
    test_host_free(&c_auto), test_host_free(&c_fused), test_host_free(&c_pdl), test_host_free(&c_chain),
        test_host_free(&normed);
    norm_gemm_host_free(&h);
}

static void norm_gemm_tests(test_rng *rng) {
    printf("the norm-GEMMs, one launch vs the norm op and the skinny kernel:\n");
    static const norm_gemm_case fixed[] = {
        {1, 2048, 0, 7728, 0, 0, GDP_DTYPE_FP32, GDP_DTYPE_BF16, 0.0f},     /* in_proj at B = 1, fp32 residual */
        {8, 2048, 0, 7728, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 0.0f},     /* in_proj at 8 rows, bf16 residual */
        {1, 2048, 512, 2048, 4096, 5680, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 1.0f}, /* out_proj: y, z row views */
        {5, 2048, 512, 2048, 2048, 24, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 1.0f},
        {3, 4096, 0, 300, 0, 0, GDP_DTYPE_FP32, GDP_DTYPE_BF16, 0.0f},      /* two chunks a thread (block) */
        {2, 512, 0, 129, 0, 0, GDP_DTYPE_FP32, GDP_DTYPE_BF16, 0.0f},       /* a warp a row */
        {4, 1024, 256, 65, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 0.0f},     /* groups of 256: one chunk */
        {9, 2048, 0, 700, 0, 0, GDP_DTYPE_FP32, GDP_DTYPE_BF16, 0.0f},      /* past the row limit: the chain */
        {12, 1024, 512, 300, 0, 8, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 1.0f},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        norm_gemm_one(&fixed[i], rng);
    for (int t = 0; t < 8; t++) {
        norm_gemm_case cs;
        cs.rows = 1 + (int64_t)(test_uniform(rng) * 8);
        const bool gated = test_uniform(rng) < 0.5;
        cs.group = gated ? 8 * (1 + (int64_t)(test_uniform(rng) * 64)) : 0;
        cs.k = gated ? cs.group * (1 + (int64_t)(test_uniform(rng) * 6)) : 8 * (1 + (int64_t)(test_uniform(rng) * 500));
        cs.n = 1 + (int64_t)(test_uniform(rng) * 2000);
        cs.x_pad = gated ? 8 * (int64_t)(test_uniform(rng) * 3) : 0; /* the pre-norm's x is contiguous */
        cs.z_pad = gated ? 8 * (int64_t)(test_uniform(rng) * 3) : 0;
        cs.x = gated ? GDP_DTYPE_BF16 : (test_uniform(rng) < 0.5 ? GDP_DTYPE_FP32 : GDP_DTYPE_BF16);
        cs.c = gated && test_uniform(rng) < 0.5 ? GDP_DTYPE_FP32 : GDP_DTYPE_BF16;
        cs.beta = gated ? 1.0f : 0.0f;
        norm_gemm_one(&cs, rng);
    }
    /* an unknown GDP_NORM_GEMM is refused before any launch */
    {
        const norm_gemm_case cs = {1, 64, 0, 8, 0, 0, GDP_DTYPE_FP32, GDP_DTYPE_BF16, 0.0f};
        norm_gemm_host h = norm_gemm_host_make(&cs, rng);
        norm_gemm_dev d;
        norm_gemm_dev_make(&d, &cs, &h);
        char *saved = test_env_swap("GDP_NORM_GEMM", "fastest");
        CHECK_STATUS(gdp_norm_gemm(g_test_gpu, &d.args), GDP_STATUS_INVALID_USAGE);
        CHECK(strstr(gdp_last_error(), "GDP_NORM_GEMM") != NULL && strstr(gdp_last_error(), "fastest") != NULL,
              "the GDP_NORM_GEMM refusal names neither the variable nor its value: %s", gdp_last_error());
        printf("  GDP_NORM_GEMM=fastest: %s\n", gdp_last_error());
        test_env_restore("GDP_NORM_GEMM", saved);
        norm_gemm_dev_free(&d);
        norm_gemm_host_free(&h);
    }
}

static void gemm_tests(test_rng *rng) {
    CHECK_OK(gdp_gemm_acquire(g_test_gpu));
    printf("the projection GEMM, skinny kernel and cuBLASLt vs the double product:\n");
    static const gemm_case fixed[] = {
        {1, 7728, 2048, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 0.0f},  /* a decode in_proj at B = 1 */
        {1, 2048, 2048, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 1.0f},  /* out_proj into the residual */
        {8, 4097, 1024, 8, 3, GDP_DTYPE_FP16, GDP_DTYPE_FP16, 1.0f},  /* the skinny limit, odd n  */
        {9, 300, 512, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 0.0f},    /* one row past it          */
        {3, 37, 8, 0, 1, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 0.0f},       /* k one chunk              */
        {4, 129, 4096, 16, 0, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 1.0f},  /* k past two spans         */
        {2, 65, 100, 4, 0, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 0.0f},     /* k % 8 != 0: cuBLASLt     */
        {5, 64, 256, 3, 0, GDP_DTYPE_FP16, GDP_DTYPE_FP32, 0.0f},     /* lda % 8 != 0: cuBLASLt   */
        /* the split-k kernel: the decode step's projections, partial tiles in rows and columns,
         * pitches, every C dtype, beta 0 and 1 */
        {64, 2048, 2048, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 1.0f},  /* out_proj at B = 64       */
        {128, 7728, 2048, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 0.0f}, /* in_proj at B = 128       */
        {256, 2048, 2048, 8, 5, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 1.0f}, /* two row tiles            */
        {37, 300, 512, 8, 3, GDP_DTYPE_FP16, GDP_DTYPE_FP16, 1.0f},    /* partial tiles, fp16      */
        {200, 129, 1024, 0, 1, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 0.0f},  /* 129 columns: two tiles   */
        {3, 64, 128, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 0.0f},      /* two chunks: two ways     */
        {17, 4000, 640, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 1.0f},   /* 10 chunks, 32 tiles: 2   */
        {300, 256, 512, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_BF16, 0.0f},   /* past 256 rows: cuBLASLt  */
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        gemm_one(&fixed[i], rng);
    for (int t = 0; t < 12; t++) { /* random shapes around the limit */
        gemm_case cs;
        cs.rows = 1 + (int64_t)(test_uniform(rng) * 16);
        cs.n = 1 + (int64_t)(test_uniform(rng) * 3000);
        cs.k = 8 * (1 + (int64_t)(test_uniform(rng) * 300));
        cs.lda_pad = 8 * (int64_t)(test_uniform(rng) * 3);
        cs.ldc_pad = (int64_t)(test_uniform(rng) * 5);
        cs.ab = test_uniform(rng) < 0.5 ? GDP_DTYPE_BF16 : GDP_DTYPE_FP16;
        cs.c = test_uniform(rng) < 0.5 ? GDP_DTYPE_FP32 : cs.ab;
        cs.beta = test_uniform(rng) < 0.5 ? 0.0f : 1.0f;
        gemm_one(&cs, rng);
    }
    /* an unknown GDP_GEMM_SKINNY or GDP_GEMM_SPLITK is refused before any launch */
    {
        const gemm_case cs = {1, 8, 8, 0, 0, GDP_DTYPE_BF16, GDP_DTYPE_FP32, 0.0f};
        const int64_t s[2] = {1, 8};
        gdp_tensor h = test_tensor_alloc(GDP_DTYPE_BF16, 2, s), hc = test_tensor_alloc(GDP_DTYPE_FP32, 2, s);
        gdp_tensor d = test_dev_upload(&h), dc = test_dev_upload(&hc);
        char *saved = test_env_swap("GDP_GEMM_SKINNY", "fastest");
        CHECK_STATUS(gdp_gemm_nt_ex(g_test_gpu, cs.rows, cs.n, cs.k, d.data, 8, d.data, cs.ab, 0.0f, dc.data, 8, cs.c),
                     GDP_STATUS_INVALID_USAGE);
        CHECK(strstr(gdp_last_error(), "GDP_GEMM_SKINNY") != NULL && strstr(gdp_last_error(), "fastest") != NULL,
              "the GDP_GEMM_SKINNY refusal names neither the variable nor its value: %s", gdp_last_error());
        printf("  GDP_GEMM_SKINNY=fastest: %s\n", gdp_last_error());
        test_env_restore("GDP_GEMM_SKINNY", saved);
        saved = test_env_swap("GDP_GEMM_SPLITK", "sometimes");
        CHECK_STATUS(gdp_gemm_nt_ex(g_test_gpu, 4, cs.n, cs.k, d.data, 8, d.data, cs.ab, 0.0f, dc.data, 8, cs.c),
                     GDP_STATUS_INVALID_USAGE);
        CHECK(strstr(gdp_last_error(), "GDP_GEMM_SPLITK") != NULL && strstr(gdp_last_error(), "sometimes") != NULL,
              "the GDP_GEMM_SPLITK refusal names neither the variable nor its value: %s", gdp_last_error());
        printf("  GDP_GEMM_SPLITK=sometimes: %s\n", gdp_last_error());
        test_env_restore("GDP_GEMM_SPLITK", saved);
        test_dev_free(&d), test_dev_free(&dc), test_host_free(&h), test_host_free(&hc);
    }
    norm_gemm_tests(rng);
    gdp_gemm_release(g_test_gpu);
}

#endif /* GDP_HAVE_CUDA */

TEST_GPU_MAIN("test_gemm_gpu", gemm_tests, 0x9e3779b97f4a7c15ull)
