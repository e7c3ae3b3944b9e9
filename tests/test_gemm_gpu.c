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
 *   - shapes the skinny kernel does not take (k % 8 != 0, a misaligned pitch) still run (cuBLASLt);
 *   - GDP_GEMM_SKINNY with an unknown value is refused naming the variable and the value.
 * Without a CUDA build or a visible GPU it prints why and exits 77 (skip).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "internal.h"
#include "kernels/gemv.h"
#include "test_gpu.h"

#ifdef GDP_HAVE_CUDA

typedef struct gemm_case {
    int64_t rows, n, k, lda_pad, ldc_pad;
    gdp_dtype_t ab, c;
    float beta;
} gemm_case;

/* One run of the GEMM on device copies of a, b and c0 under GDP_GEMM_SKINNY=mode; the host C. */
static gdp_tensor run_gemm(const gemm_case *cs, const char *mode, const gdp_tensor *a, const gdp_tensor *b,
                           const gdp_tensor *c0) {
    gdp_tensor da = test_dev_upload(a), db = test_dev_upload(b), dc = test_dev_upload(c0);
    char *saved = test_env_swap("GDP_GEMM_SKINNY", mode);
    CHECK_OK(gdp_gemm_nt_ex(g_test_gpu, cs->rows, cs->n, cs->k, da.data, cs->k + cs->lda_pad, db.data, cs->ab,
                            cs->beta, dc.data, cs->n + cs->ldc_pad, cs->c));
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
    gdp_tensor skinny = run_gemm(cs, "on", &a, &b, &c0), blas = run_gemm(cs, "off", &a, &b, &c0);
    check_gemm(fits ? "skinny" : "fallback", cs, &skinny, ha, hb, hc);
    check_gemm("cublasLt", cs, &blas, ha, hb, hc);
    if (fits) {
        gdp_tensor again = run_gemm(cs, "on", &a, &b, &c0);
        test_same_bytes("skinny GEMM twice", &skinny, &again);
        test_host_free(&again);
    }
    free(ha), free(hb), free(hc);
    test_host_free(&a), test_host_free(&b), test_host_free(&c0), test_host_free(&skinny), test_host_free(&blas);
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
    /* an unknown GDP_GEMM_SKINNY is refused before any launch */
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
        test_dev_free(&d), test_dev_free(&dc), test_host_free(&h), test_host_free(&hc);
    }
    gdp_gemm_release(g_test_gpu);
}

#endif /* GDP_HAVE_CUDA */

TEST_GPU_MAIN("test_gemm_gpu", gemm_tests, 0x9e3779b97f4a7c15ull)
