/*
 * test_norm_cpu.c: the CPU reference of gdp_gated_rmsnorm and gdp_rmsnorm.
 *   - gated_norm.safetensors (PyTorch CUDA eager, eps 1e-5, group_size 64): a bf16 out
 *     bitwise or within one bf16 ulp of out_bf16_ref, an fp32 out within 1e-5 relative
 *     of out_ref;
 *   - gdp_rmsnorm and gdp_gated_rmsnorm on random [2, 3, d] input (leading dims
 *     flattened to rows) against a direct double computation written here;
 *   - gdp_gated_rmsnorm on row views (y and z 2-D slices of wider rows, as the layer reads
 *     the gate from its projection) bitwise equal to the same rows made contiguous; row
 *     views with overlapping rows, a strided last dim or more than 2 dims are refused;
 *   - bad inputs (group_size 0, negative, not dividing d; a weight, z or out of the wrong
 *     shape; negative eps) give INVALID_ARGUMENT and leave out untouched;
 *   - the norm-GEMMs (src/decode_core.h gdp_norm_gemm: the pre-RMSNorm then in_proj, the gated
 *     norm then out_proj with beta 1) bitwise equal to the norm op followed by the GEMM on the CPU
 *     backend (which never takes the CUDA one launch: gdp_norm_gemm_fuses is false); an unknown
 *     GDP_NORM_GEMM, a group not dividing d and missing arguments are refused before anything is
 *     written.
 */
#include <string.h>

#include "backend.h"     /* gdp_gemm_nt_ex */
#include "decode_core.h" /* gdp_norm_gemm */
#include "internal.h"    /* defines: gdp_tensor_get/set */
#include "test_common.h"

static void golden(gdp_ctx_t ctx) {
    test_gated_norm_golden g;
    if (!test_gated_norm_golden_read(&g))
        return;
    gdp_tensor y = g.y, z = g.z, w = g.w, ref32 = g.ref32, ref16 = g.ref16;
    const double eps = g.eps;
    const int64_t group = g.group;
    const int64_t n = gdp_tensor_numel(&y);

    gdp_tensor o16 = test_tensor_alloc(GDP_DTYPE_BF16, y.ndim, y.shape);
    test_fill_nan(&o16);
    CHECK_OK(gdp_gated_rmsnorm(ctx, &o16, &y, &z, &w, group, eps));
    int64_t worst = 0, exact = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t d = test_bf16_ulp_distance(((uint16_t *)o16.data)[i], ((uint16_t *)ref16.data)[i]);
        worst = d > worst ? d : worst;
        exact += d == 0;
    }
    CHECK(worst <= 1, "gated_norm: bf16 out is %lld bf16 ulp from out_bf16_ref (bar 1)", (long long)worst);

    gdp_tensor o32 = test_tensor_alloc(GDP_DTYPE_FP32, y.ndim, y.shape);
    test_fill_nan(&o32);
    CHECK_OK(gdp_gated_rmsnorm(ctx, &o32, &y, &z, &w, group, eps));
    double *od = test_tensor_f64(&o32), *rd = test_tensor_f64(&ref32);
    test_compare("gated_norm fp32 out", od, rd, n, 1e-5, 0, 1e-5);
    printf("gated_norm [%lld, %lld], group %lld: bf16 out %lld of %lld bitwise, max %lld ulp; fp32 out relative RMS "
           "%.2e vs out_ref (elementwise rtol 1e-5)\n",
           (long long)y.shape[0], (long long)y.shape[1], (long long)group, (long long)exact, (long long)n,
           (long long)worst, test_rel_rms(od, rd, n));
    free(od); free(rd);
    free(y.data); free(z.data); free(w.data); free(ref32.data); free(ref16.data); free(o16.data); free(o32.data);
}

/* Direct double reference: out = x / sqrt(mean over the group of x^2 + eps) * w, with
 * x = y * silu(z) when z is given. */
static void reference(const double *y, const double *z, const double *w, int64_t rows, int64_t d, int64_t group,
                      double eps, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t g0 = 0; g0 < d; g0 += group) {
            double ss = 0;
            for (int64_t i = g0; i < g0 + group; i++) {
                const double x = z ? y[r * d + i] * z[r * d + i] / (1 + exp(-z[r * d + i])) : y[r * d + i];
                out[r * d + i] = x;
                ss += x * x;
            }
            const double rstd = 1 / sqrt(ss / (double)group + eps);
            for (int64_t i = g0; i < g0 + group; i++)
                out[r * d + i] *= rstd * w[i];
        }
    }
}

static void random_cases(gdp_ctx_t ctx, test_rng *rng) {
    const int64_t d = 48, rows = 6, shape[3] = {2, 3, d}, wshape[1] = {d};
    const double eps = 1e-6;
    gdp_tensor x = test_tensor_alloc(GDP_DTYPE_FP32, 3, shape), z = test_tensor_alloc(GDP_DTYPE_FP32, 3, shape);
    gdp_tensor w = test_tensor_alloc(GDP_DTYPE_FP32, 1, wshape), out = test_tensor_alloc(GDP_DTYPE_FP32, 3, shape);
    test_fill_uniform(&x, rng, -3, 3);
    test_fill_uniform(&z, rng, -4, 4);
    test_fill_uniform(&w, rng, 0.5, 1.5);
    double *xd = test_tensor_f64(&x), *zd = test_tensor_f64(&z), *wd = test_tensor_f64(&w);
    double *want = malloc(sizeof(double) * (size_t)(rows * d));

    test_fill_nan(&out);
    CHECK_OK(gdp_rmsnorm(ctx, &out, &x, &w, eps));
    reference(xd, NULL, wd, rows, d, d, eps, want);
    double *got = test_tensor_f64(&out);
    test_compare("rmsnorm [2, 3, 48] vs double", got, want, rows * d, 1e-7, 0, 1e-6);
    printf("rmsnorm [2, 3, 48]: relative RMS %.2e vs a direct double computation\n",
           test_rel_rms(got, want, rows * d));
    free(got);

    const int64_t groups[3] = {48, 16, 12};
    for (int i = 0; i < 3; i++) {
        test_fill_nan(&out);
        CHECK_OK(gdp_gated_rmsnorm(ctx, &out, &x, &z, &w, groups[i], eps));
        reference(xd, zd, wd, rows, d, groups[i], eps, want);
        got = test_tensor_f64(&out);
        char what[80];
        snprintf(what, sizeof what, "gated rmsnorm group %lld vs double", (long long)groups[i]);
        test_compare(what, got, want, rows * d, 1e-7, 0, 1e-6);
        printf("gated rmsnorm [2, 3, 48], group %lld: relative RMS %.2e vs a direct double computation\n",
               (long long)groups[i], test_rel_rms(got, want, rows * d));
        free(got);
    }
    free(xd); free(zd); free(wd); free(want);
    free(x.data); free(z.data); free(w.data); free(out.data);
}

/* A [rows, d] row view of `pitch` elements per row over a fresh buffer, filled at random. */
static gdp_tensor row_view(test_rng *rng, gdp_dtype_t dt, int64_t rows, int64_t d, int64_t pitch) {
    const int64_t flat[1] = {rows * pitch};
    gdp_tensor buf = test_tensor_alloc(dt, 1, flat);
    test_fill_uniform(&buf, rng, -2.0, 2.0);
    gdp_tensor v = {.data = buf.data, .dtype = dt, .ndim = 2, .shape = {rows, d}, .stride = {pitch, 1}};
    return v;
}

static void row_views(gdp_ctx_t ctx, test_rng *rng) {
    const int64_t rows = 5, d = 48, group = 16, shape[2] = {rows, d}, wshape[1] = {d};
    const gdp_dtype_t dts[2] = {GDP_DTYPE_FP32, GDP_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        gdp_tensor y = row_view(rng, dts[k], rows, d, 80), z = row_view(rng, dts[k], rows, d, 64);
        gdp_tensor yc = test_tensor_alloc(dts[k], 2, shape), zc = test_tensor_alloc(dts[k], 2, shape);
        for (int64_t i = 0; i < rows * d; i++) {
            gdp_tensor_set(&yc, i, gdp_tensor_get(&y, i));
            gdp_tensor_set(&zc, i, gdp_tensor_get(&z, i));
        }
        gdp_tensor w = test_tensor_alloc(dts[k], 1, wshape);
        test_fill_uniform(&w, rng, 0.5, 1.5);
        gdp_tensor out = test_tensor_alloc(dts[k], 2, shape), outc = test_tensor_alloc(dts[k], 2, shape);
        CHECK_OK(gdp_gated_rmsnorm(ctx, &out, &y, &z, &w, group, 1e-5));
        CHECK_OK(gdp_gated_rmsnorm(ctx, &outc, &yc, &zc, &w, group, 1e-5));
        CHECK(memcmp(out.data, outc.data, test_tensor_bytes(&out)) == 0,
              "gated rmsnorm on row views (pitches 80, 64) differs from the contiguous rows (%s)",
              gdp_dtype_name(dts[k]));
        printf("gated rmsnorm, y and z row views of pitch 80 and 64 (%s): bitwise equal to contiguous rows\n",
               gdp_dtype_name(dts[k]));
        if (k == 0) { /* refused views, nothing written */
            test_fill_nan(&out);
            void *before = malloc(test_tensor_bytes(&out));
            memcpy(before, out.data, test_tensor_bytes(&out));
            gdp_tensor overlap = y;
            overlap.stride[0] = 40; /* rows of 48 elements 40 apart */
            CHECK_STATUS(gdp_gated_rmsnorm(ctx, &out, &overlap, &z, &w, group, 1e-5), GDP_STATUS_INVALID_ARGUMENT);
            CHECK(strstr(gdp_last_error(), "rows overlap") != NULL, "the refusal names another cause: %s",
                  gdp_last_error());
            printf("  rejected overlapping rows: %s\n", gdp_last_error());
            const int64_t half[2] = {rows, d / 2}, whalf[1] = {d / 2};
            gdp_tensor y_half = test_tensor_alloc(dts[k], 2, half), out_half = test_tensor_alloc(dts[k], 2, half);
            gdp_tensor w_half = test_tensor_alloc(dts[k], 1, whalf);
            test_fill_uniform(&y_half, rng, -1.0, 1.0);
            test_fill_uniform(&w_half, rng, 0.5, 1.5);
            gdp_tensor cols = {.data = z.data, .dtype = z.dtype, .ndim = 2, .shape = {rows, d / 2}, .stride = {64, 2}};
            CHECK_STATUS(gdp_gated_rmsnorm(ctx, &out_half, &y_half, &cols, &w_half, 8, 1e-5),
                         GDP_STATUS_INVALID_ARGUMENT);
            CHECK(strstr(gdp_last_error(), "z has last-dim stride 2") != NULL, "the refusal names another cause: %s",
                  gdp_last_error());
            printf("  rejected a strided last dim: %s\n", gdp_last_error());
            free(y_half.data); free(out_half.data); free(w_half.data);
            gdp_tensor three = {.data = y.data, .dtype = y.dtype, .ndim = 3, .shape = {1, rows, d},
                                .stride = {rows * 80, 80, 1}};
            gdp_tensor z3, out3;
            CHECK_OK(gdp_tensor_init(&z3, zc.data, zc.dtype, 3, (const int64_t[]){1, rows, d}));
            CHECK_OK(gdp_tensor_init(&out3, out.data, out.dtype, 3, (const int64_t[]){1, rows, d}));
            CHECK_STATUS(gdp_gated_rmsnorm(ctx, &out3, &three, &z3, &w, group, 1e-5), GDP_STATUS_INVALID_ARGUMENT);
            CHECK(strstr(gdp_last_error(), "3 dims") != NULL, "the refusal names another cause: %s", gdp_last_error());
            printf("  rejected a strided 3-D y: %s\n", gdp_last_error());
            CHECK(memcmp(before, out.data, test_tensor_bytes(&out)) == 0, "a rejected row-view call modified out");
            free(before);
        }
        free(y.data); free(z.data); free(yc.data); free(zc.data); free(w.data); free(out.data); free(outc.data);
    }
}

static void bad_inputs(gdp_ctx_t ctx) {
    printf("bad inputs:\n");
    const int64_t shape[2] = {3, 32}, wshape[1] = {32};
    gdp_tensor y = test_tensor_alloc(GDP_DTYPE_FP32, 2, shape), z = test_tensor_alloc(GDP_DTYPE_FP32, 2, shape);
    gdp_tensor w = test_tensor_alloc(GDP_DTYPE_FP32, 1, wshape), out = test_tensor_alloc(GDP_DTYPE_FP32, 2, shape);
    test_fill_nan(&out);
    void *before = malloc(test_tensor_bytes(&out));
    memcpy(before, out.data, test_tensor_bytes(&out));
    const int64_t bad_groups[3] = {0, -8, 12};
    for (int i = 0; i < 3; i++) {
        CHECK_STATUS(gdp_gated_rmsnorm(ctx, &out, &y, &z, &w, bad_groups[i], 1e-5), GDP_STATUS_INVALID_ARGUMENT);
        printf("  rejected group_size %lld: %s\n", (long long)bad_groups[i], gdp_last_error());
        CHECK(strstr(gdp_last_error(), "group_size") != NULL, "message lacks group_size: %s", gdp_last_error());
    }
    gdp_tensor w_bad = w;
    w_bad.shape[0] = 16;
    CHECK_STATUS(gdp_gated_rmsnorm(ctx, &out, &y, &z, &w_bad, 16, 1e-5), GDP_STATUS_INVALID_ARGUMENT);
    printf("  rejected a weight of 16 for 32 channels: %s\n", gdp_last_error());
    gdp_tensor z_bad = z;
    z_bad.shape[0] = 2;
    CHECK_STATUS(gdp_gated_rmsnorm(ctx, &out, &y, &z_bad, &w, 16, 1e-5), GDP_STATUS_INVALID_ARGUMENT);
    printf("  rejected z of another shape than y: %s\n", gdp_last_error());
    gdp_tensor out_bad = out;
    out_bad.shape[1] = 16;
    out_bad.shape[0] = 6;
    CHECK_STATUS(gdp_rmsnorm(ctx, &out_bad, &y, &w, 1e-5), GDP_STATUS_INVALID_ARGUMENT);
    printf("  rejected out of another shape than x: %s\n", gdp_last_error());
    CHECK_STATUS(gdp_rmsnorm(ctx, &out, &y, &w, -1.0), GDP_STATUS_INVALID_ARGUMENT);
    printf("  rejected eps -1: %s\n", gdp_last_error());
    CHECK_STATUS(gdp_rmsnorm(ctx, &out, NULL, &w, 1e-5), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(memcmp(before, out.data, test_tensor_bytes(&out)) == 0, "a rejected call modified out");
    free(before);
    free(y.data); free(z.data); free(w.data); free(out.data);
}

/* One norm-GEMM case on the CPU backend: gdp_norm_gemm against the norm op then the GEMM. */
static void norm_gemm_case(gdp_ctx_t ctx, test_rng *rng, bool gated) {
    const int64_t rows = 3, k = 64, n = 40, group = gated ? 16 : k;
    const int64_t sx[2] = {rows, k}, sw[1] = {k}, sb[2] = {n, k}, sc[2] = {rows, n};
    gdp_tensor x = test_tensor_alloc(GDP_DTYPE_FP32, 2, sx), z = test_tensor_alloc(GDP_DTYPE_FP32, 2, sx);
    gdp_tensor w = test_tensor_alloc(GDP_DTYPE_FP32, 1, sw), B = test_tensor_alloc(GDP_DTYPE_FP32, 2, sb);
    gdp_tensor c1 = test_tensor_alloc(GDP_DTYPE_FP32, 2, sc), c2 = test_tensor_alloc(GDP_DTYPE_FP32, 2, sc);
    gdp_tensor o1 = test_tensor_alloc(GDP_DTYPE_FP32, 2, sx), o2 = test_tensor_alloc(GDP_DTYPE_FP32, 2, sx);
    test_fill_uniform(&x, rng, -2.0, 2.0), test_fill_uniform(&z, rng, -3.0, 3.0);
    test_fill_uniform(&w, rng, 0.5, 1.5), test_fill_uniform(&B, rng, -1.0, 1.0);
    test_fill_uniform(&c1, rng, -4.0, 4.0);
    memcpy(c2.data, c1.data, test_tensor_bytes(&c1));
    const float beta = gated ? 1.0f : 0.0f;
    const gdp_norm_gemm_args a = {.out = &o1, .x = &x, .z = gated ? &z : NULL, .weight = &w, .group_size = group,
                                  .eps = 1e-5, .n = n, .B = B.data, .beta = beta, .C = c1.data, .ldc = n,
                                  .c_dtype = GDP_DTYPE_FP32};
    CHECK(!gdp_norm_gemm_fuses(ctx, &a), "gdp_norm_gemm_fuses is true on the CPU backend");
    CHECK_OK(gdp_norm_gemm(ctx, &a));
    if (gated)
        CHECK_OK(gdp_gated_rmsnorm(ctx, &o2, &x, &z, &w, group, 1e-5));
    else
        CHECK_OK(gdp_rmsnorm(ctx, &o2, &x, &w, 1e-5));
    CHECK_OK(gdp_gemm_nt_ex(ctx, rows, n, k, o2.data, k, B.data, GDP_DTYPE_FP32, beta, c2.data, n, GDP_DTYPE_FP32));
    test_same_bytes(gated ? "gated norm-GEMM: C" : "rms norm-GEMM: C", &c1, &c2);
    test_same_bytes(gated ? "gated norm-GEMM: the norm's output" : "rms norm-GEMM: the norm's output", &o1, &o2);

    /* refusals: nothing written */
    memcpy(c2.data, c1.data, test_tensor_bytes(&c1));
    memcpy(o2.data, o1.data, test_tensor_bytes(&o1));
    char *saved = test_env_swap("GDP_NORM_GEMM", "fastest");
    CHECK_STATUS(gdp_norm_gemm(ctx, &a), GDP_STATUS_INVALID_USAGE);
    CHECK(strstr(gdp_last_error(), "GDP_NORM_GEMM") != NULL && strstr(gdp_last_error(), "fastest") != NULL,
          "the GDP_NORM_GEMM refusal names neither the variable nor its value: %s", gdp_last_error());
    test_env_restore("GDP_NORM_GEMM", saved);
    gdp_norm_gemm_args bad = a;
    if (gated) {
        bad.group_size = 12; /* does not divide 64 */
        CHECK_STATUS(gdp_norm_gemm(ctx, &bad), GDP_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(gdp_last_error(), "group_size") != NULL, "message lacks group_size: %s", gdp_last_error());
    } else {
        bad.eps = -1.0;
        CHECK_STATUS(gdp_norm_gemm(ctx, &bad), GDP_STATUS_INVALID_ARGUMENT);
    }
    bad = a;
    bad.weight = NULL;
    CHECK_STATUS(gdp_norm_gemm(ctx, &bad), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_norm_gemm(ctx, NULL), GDP_STATUS_INVALID_ARGUMENT);
    test_same_bytes("a refused norm-GEMM: C untouched", &c1, &c2);
    test_same_bytes("a refused norm-GEMM: out untouched", &o1, &o2);
    printf("  %s norm-GEMM [%lld, %lld] x [%lld, %lld]^T: bitwise the norm op then the GEMM; refusals write nothing\n",
           gated ? "gated" : "rms", (long long)rows, (long long)k, (long long)n, (long long)k);
    free(x.data), free(z.data), free(w.data), free(B.data), free(c1.data), free(c2.data), free(o1.data),
        free(o2.data);
}

int main(void) {
    gdp_ctx_t ctx = NULL;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    test_rng rng;
    test_rng_seed(&rng, 99);
    golden(ctx);
    random_cases(ctx, &rng);
    row_views(ctx, &rng);
    bad_inputs(ctx);
    printf("the norm-GEMMs:\n");
    norm_gemm_case(ctx, &rng, false);
    norm_gemm_case(ctx, &rng, true);
    gdp_ctx_free(ctx);
    return test_finish("test_norm_cpu");
}
