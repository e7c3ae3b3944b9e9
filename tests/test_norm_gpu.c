/*
 * test_norm_gpu.c: the CUDA backend of the norm ops (gated RMSNorm, RMSNorm, L2 norm),
 * through the public API on device buffers, against the golden file and the CPU backend
 * (same API, host copies of the same inputs; the CPU side is test_norm_cpu.c). Checked:
 * gated_norm.safetensors (bf16 within one ulp of out_bf16_ref, fp32 within 1e-5 relative of
 * out_ref); gated RMSNorm, RMSNorm and L2 norm on random shapes and dtypes vs the CPU (fp32
 * within 1e-5 relative, 16-bit within one ulp); the in-place L2 norm equals the out-of-place
 * one bitwise; the gated norm on row views (fast and general path) vs the CPU and bitwise vs
 * contiguous rows.
 * Device helpers: test_gpu.h. Without a CUDA build or a visible GPU it prints why and exits
 * 77 (skip).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* defines: gdp_tensor_get/set, gdp_tensor_stride */
#include "test_gpu.h"

#ifdef GDP_HAVE_CUDA

static void norm_golden(void) {
    test_gated_norm_golden g;
    if (!test_gated_norm_golden_read(&g))
        return;
    gdp_tensor y = g.y, z = g.z, w = g.w, ref32 = g.ref32, ref16 = g.ref16;
    const double eps = g.eps;
    const int64_t group = g.group;
    gdp_tensor dy = test_dev_clone(&y), dz = test_dev_clone(&z), dw = test_dev_clone(&w);
    gdp_tensor o16 = test_tensor_alloc(GDP_DTYPE_BF16, y.ndim, y.shape), o32 = test_tensor_alloc(GDP_DTYPE_FP32, y.ndim, y.shape);
    gdp_tensor d16 = test_dev_poisoned(&o16), d32 = test_dev_poisoned(&o32);
    CHECK_OK(gdp_gated_rmsnorm(g_test_gpu, &d16, &dy, &dz, &dw, group, eps));
    CHECK_OK(gdp_gated_rmsnorm(g_test_gpu, &d32, &dy, &dz, &dw, group, eps));
    test_dev_fetch(&o16, &d16);
    test_dev_fetch(&o32, &d32);
    int64_t where, exact = 0;
    const int64_t ulp = test_max_ulp(&o16, &ref16, &where);
    for (int64_t i = 0; i < gdp_tensor_numel(&o16); i++)
        exact += ((uint16_t *)o16.data)[i] == ((uint16_t *)ref16.data)[i];
    CHECK(ulp <= 1, "gated_norm golden: bf16 out %lld ulp from out_bf16_ref at [%lld] (bar 1)", (long long)ulp,
          (long long)where);
    printf("gated_norm.safetensors (group %lld, eps %g):\n", (long long)group, eps);
    test_compare_bar("fp32 out vs out_ref (rtol 1e-5)", &o32, &ref32, 0, 1e-5, GDP_DTYPE_FP32);
    printf("  bf16 out: %lld of %lld bitwise equal to out_bf16_ref, max %lld ulp\n", (long long)exact,
           (long long)gdp_tensor_numel(&o16), (long long)ulp);
    test_dev_free(&dy), test_dev_free(&dz), test_dev_free(&dw), test_dev_free(&d16), test_dev_free(&d32);
    test_host_free(&y), test_host_free(&z), test_host_free(&w), test_host_free(&ref32), test_host_free(&ref16), test_host_free(&o16);
    test_host_free(&o32);
}

/* out vs a CPU out of the same dtype: fp32 within 1e-5 relative, 16-bit within one ulp. */
static void compare_norm_out(const char *what, const gdp_tensor *got, const gdp_tensor *ref) {
    test_compare_fp32_or_1ulp(what, got, ref, 0, 1e-5);
}

typedef struct norm_cfg {
    int kind; /* 0 gated RMSNorm, 1 RMSNorm, 2 L2 norm */
    int64_t rows, d, group;
    gdp_dtype_t in_dt, w_dt, out_dt;
} norm_cfg;

static void norm_vs_cpu(test_rng *r, const norm_cfg *c) {
    static const char *kinds[3] = {"gated rmsnorm", "rmsnorm", "l2norm"};
    char label[160];
    snprintf(label, sizeof label, "%s rows=%lld d=%lld group=%lld in %s out %s", kinds[c->kind], (long long)c->rows,
             (long long)c->d, (long long)c->group, gdp_dtype_name(c->in_dt), gdp_dtype_name(c->out_dt));
    const int64_t shape[2] = {c->rows, c->d}, ws[1] = {c->d};
    gdp_tensor x = test_tensor_alloc(c->in_dt, 2, shape), z = test_tensor_alloc(c->in_dt, 2, shape);
    gdp_tensor w = test_tensor_alloc(c->w_dt, 1, ws);
    gdp_tensor out = test_tensor_alloc(c->out_dt, 2, shape), got = test_tensor_alloc(c->out_dt, 2, shape);
    test_fill_normal(&x, r, 2.0);
    test_fill_normal(&z, r, 2.0);
    test_fill_uniform(&w, r, 0.5, 1.5);
    gdp_tensor dx = test_dev_clone(&x), dz = test_dev_clone(&z), dw = test_dev_clone(&w), dout = test_dev_poisoned(&out);
    const double eps = 1e-5;
    switch (c->kind) {
    case 0:
        CHECK_OK(gdp_gated_rmsnorm(g_test_cpu, &out, &x, &z, &w, c->group, eps));
        CHECK_OK(gdp_gated_rmsnorm(g_test_gpu, &dout, &dx, &dz, &dw, c->group, eps));
        break;
    case 1:
        CHECK_OK(gdp_rmsnorm(g_test_cpu, &out, &x, &w, eps));
        CHECK_OK(gdp_rmsnorm(g_test_gpu, &dout, &dx, &dw, eps));
        break;
    default:
        CHECK_OK(gdp_l2norm(g_test_cpu, &out, &x));
        CHECK_OK(gdp_l2norm(g_test_gpu, &dout, &dx));
        break;
    }
    test_dev_fetch(&got, &dout);
    printf("%s:\n", label);
    compare_norm_out("out vs CPU", &got, &out);
    if (c->kind == 2 && c->in_dt == c->out_dt) {
        /* In place (y == x) gives the out-of-place bits. */
        CHECK_OK(gdp_l2norm(g_test_gpu, &dx, &dx));
        gdp_tensor inplace = test_host_clone(&got);
        test_dev_fetch(&inplace, &dx);
        test_same_bytes("l2norm in place vs out of place", &inplace, &got);
        printf("  in place: %s\n", memcmp(inplace.data, got.data, test_span_bytes(&got)) == 0 ? "bitwise equal" : "DIFFERENT");
        test_host_free(&inplace);
    }
    test_dev_free(&dx), test_dev_free(&dz), test_dev_free(&dw), test_dev_free(&dout);
    test_host_free(&x), test_host_free(&z), test_host_free(&w), test_host_free(&out), test_host_free(&got);
}

/* The gated norm on row views (y and z 2-D slices of wider rows: the layer reads the gate
 * from its projection and y from the decode op's last copies): the GPU vs the CPU on the
 * same views, and bitwise equal to the GPU on the rows made contiguous. Pitches whose rows
 * stay 16-byte aligned take the fast path, the others the general one. */
static void norm_row_views(test_rng *r) {
    const int64_t rows = 6, d = 2048, group = 512, shape[2] = {rows, d}, ws[1] = {d};
    const int64_t pitches[2][2] = {{2048 + 64, 7680}, {2048 + 4, 2048 + 12}}; /* aligned; not aligned */
    for (int k = 0; k < 2; k++) {
        gdp_tensor view[2], packed[2];
        for (int v = 0; v < 2; v++) {
            const int64_t flat[1] = {rows * pitches[k][v]};
            gdp_tensor buf = test_tensor_alloc(GDP_DTYPE_BF16, 1, flat);
            test_fill_normal(&buf, r, 2.0);
            view[v] = (gdp_tensor){.data = buf.data, .dtype = GDP_DTYPE_BF16, .ndim = 2, .shape = {rows, d},
                                   .stride = {pitches[k][v], 1}};
            packed[v] = test_tensor_alloc(GDP_DTYPE_BF16, 2, shape);
            for (int64_t i = 0; i < rows * d; i++)
                gdp_tensor_set(&packed[v], i, gdp_tensor_get(&view[v], i));
        }
        gdp_tensor w = test_tensor_alloc(GDP_DTYPE_BF16, 1, ws);
        test_fill_uniform(&w, r, 0.5, 1.5);
        gdp_tensor out = test_tensor_alloc(GDP_DTYPE_BF16, 2, shape), got = test_tensor_alloc(GDP_DTYPE_BF16, 2, shape);
        gdp_tensor got_packed = test_tensor_alloc(GDP_DTYPE_BF16, 2, shape);
        gdp_tensor dy = test_dev_clone(&view[0]), dz = test_dev_clone(&view[1]), dw = test_dev_clone(&w);
        gdp_tensor dyp = test_dev_clone(&packed[0]), dzp = test_dev_clone(&packed[1]);
        gdp_tensor dout = test_dev_poisoned(&out), doutp = test_dev_poisoned(&out);
        CHECK_OK(gdp_gated_rmsnorm(g_test_cpu, &out, &view[0], &view[1], &w, group, 1e-5));
        CHECK_OK(gdp_gated_rmsnorm(g_test_gpu, &dout, &dy, &dz, &dw, group, 1e-5));
        CHECK_OK(gdp_gated_rmsnorm(g_test_gpu, &doutp, &dyp, &dzp, &dw, group, 1e-5));
        test_dev_fetch(&got, &dout);
        test_dev_fetch(&got_packed, &doutp);
        printf("gated rmsnorm on row views (y pitch %lld, z pitch %lld, %s path):\n", (long long)pitches[k][0],
               (long long)pitches[k][1], k == 0 ? "fast" : "general");
        compare_norm_out("out vs CPU on the same views", &got, &out);
        test_same_bytes("row views vs the same rows contiguous", &got, &got_packed);
        test_dev_free(&dy), test_dev_free(&dz), test_dev_free(&dw), test_dev_free(&dyp), test_dev_free(&dzp), test_dev_free(&dout), test_dev_free(&doutp);
        for (int v = 0; v < 2; v++)
            free(view[v].data), test_host_free(&packed[v]);
        test_host_free(&w), test_host_free(&out), test_host_free(&got), test_host_free(&got_packed);
    }
}

static void norm_tests(test_rng *r) {
    norm_golden();
    norm_row_views(r);
    const gdp_dtype_t F32 = GDP_DTYPE_FP32, BF = GDP_DTYPE_BF16, F16 = GDP_DTYPE_FP16;
    const norm_cfg cases[] = {
        {0, 33, 512, 128, BF, BF, BF}, {0, 7, 256, 256, F32, F32, F32}, {0, 50, 96, 32, F16, BF, F32},
        {0, 4, 48, 12, BF, F32, F16},  {1, 7, 4096, 4096, BF, BF, BF},  {1, 100, 33, 33, F32, F32, F32},
        {2, 35, 128, 128, BF, BF, BF}, {2, 300, 100, 100, F32, F32, F32}, {2, 64, 256, 256, F16, F16, F32},
        /* every chunk count of the fast path (norm.cu): warp per vector with 2 and 4 chunks
         * per lane, block per vector with 1, 4 and 8; the layer's pre-norm (fp32 residual in,
         * bf16 out) and its gated norm shape (groups of 512) */
        {0, 5, 2048, 512, BF, BF, BF},  {0, 3, 2048, 1024, F16, F16, F16}, {1, 9, 2048, 2048, F32, BF, BF},
        {1, 3, 8192, 8192, BF, BF, BF}, {1, 2, 16384, 16384, BF, F32, F32}, {2, 4, 1000, 1000, BF, BF, BF},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        norm_vs_cpu(r, &cases[i]);
}

#endif /* GDP_HAVE_CUDA */

TEST_GPU_MAIN("test_norm_gpu", norm_tests, 20261129)
