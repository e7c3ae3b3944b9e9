/*
 * test_common.c: shared test helpers (see test_common.h).
 */
#include "test_common.h"

#include <string.h>

#include "internal.h"

int g_test_failures = 0;
int g_test_checks = 0;

int test_finish(const char *name) {
    printf("%s: %d checks, %d failures\n", name, g_test_checks, g_test_failures);
    return g_test_failures ? 1 : 0;
}

void test_rng_seed(test_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull; if (!r->s) r->s = 1; }

static uint64_t next_u64(test_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 2685821657736338717ull;
}

double test_uniform(test_rng *r) { return (double)(next_u64(r) >> 11) * 0x1.0p-53; }
double test_uniform_range(test_rng *r, double lo, double hi) { return lo + (hi - lo) * test_uniform(r); }
double test_normal(test_rng *r) {
    double u1 = test_uniform(r), u2 = test_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double test_rel_rms(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    if (isnan(num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int64_t test_count_bad(const double *a, const double *b, int64_t n, double atol, double rtol, int64_t *worst) {
    int64_t bad = 0, w = -1;
    double wd = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        bool ok = d <= atol + rtol * fabs(b[i]);
        if (!ok || isnan(d)) {
            bad++;
            if (isnan(d) || d > wd) { wd = isnan(d) ? INFINITY : d; w = i; }
        }
    }
    if (worst) *worst = w;
    return bad;
}

bool test_compare(const char *what, const double *a, const double *b, int64_t n, double rel_bar, double atol,
                  double rtol) {
    bool ok = true;
    double rel = test_rel_rms(a, b, n);
    double bn = 0;
    for (int64_t i = 0; i < n; i++) bn += b[i] * b[i];
    if (rel_bar > 0) {
        double bar = bn > 0 ? rel_bar : 1e-6; /* all-zero reference: absolute 1e-6 */
        CHECK(rel < bar, "%s: relative RMS %.3e >= %.1e (n=%lld)", what, rel, bar, (long long)n);
        ok = ok && rel < bar;
    }
    if (atol >= 0) {
        int64_t worst;
        int64_t bad = test_count_bad(a, b, n, atol, rtol, &worst);
        CHECK(bad == 0, "%s: %lld of %lld elements outside atol=%.1e rtol=%.1e; worst [%lld] got %.9g want %.9g",
              what, (long long)bad, (long long)n, atol, rtol, (long long)worst, worst >= 0 ? a[worst] : 0.0,
              worst >= 0 ? b[worst] : 0.0);
        ok = ok && bad == 0;
    }
    return ok;
}

const char *test_golden_dir(void) {
    const char *e = getenv("GDP_GOLDEN_DIR");
    if (e && *e) return e;
    return GDP_SOURCE_DIR "/../shared/golden";
}

gdp_st_file *test_golden_open(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", test_golden_dir(), name);
    gdp_st_file *f = NULL;
    gdp_status_t st = gdp_st_open(path, &f);
    CHECK(st == GDP_STATUS_SUCCESS, "cannot open golden file %s: %s (set GDP_GOLDEN_DIR)", path, gdp_last_error());
    return st == GDP_STATUS_SUCCESS ? f : NULL;
}

bool test_st_tensor(gdp_st_file *f, const char *name, gdp_tensor *t) {
    void *data = NULL;
    const gdp_st_info *info = NULL;
    memset(t, 0, sizeof *t);
    gdp_status_t st = gdp_st_load(f, name, &data, &info);
    CHECK(st == GDP_STATUS_SUCCESS, "golden tensor %s: %s", name, gdp_last_error());
    if (st != GDP_STATUS_SUCCESS) return false;
    CHECK(info->dtype != GDP_DTYPE_NUM, "golden tensor %s has dtype %s", name, info->st_dtype);
    gdp_tensor_init(t, data, info->dtype, info->ndim, info->shape);
    return true;
}

double *test_st_f64(gdp_st_file *f, const char *name, int64_t *n) {
    gdp_tensor t;
    if (!test_st_tensor(f, name, &t)) return NULL;
    double *d = gdp_tensor_to_f64(&t);
    if (n) *n = gdp_tensor_numel(&t);
    free(t.data);
    return d;
}

double test_st_meta_num(gdp_st_file *f, const char *key, double dflt) {
    const char *s = gdp_st_metadata(f, key);
    if (s == NULL) return dflt;
    if (strcmp(s, "true") == 0) return 1;
    if (strcmp(s, "false") == 0) return 0;
    return atof(s);
}

gdp_tensor test_tensor_alloc(gdp_dtype_t dtype, int32_t ndim, const int64_t *shape) {
    gdp_tensor t;
    gdp_tensor_init(&t, NULL, dtype, ndim, shape);
    t.data = calloc((size_t)(gdp_tensor_numel(&t) ? gdp_tensor_numel(&t) : 1), gdp_dtype_size(dtype));
    return t;
}

void test_fill_uniform(gdp_tensor *t, test_rng *r, double lo, double hi) {
    int64_t n = gdp_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) gdp_tensor_set(t, i, test_uniform_range(r, lo, hi));
}

double *test_tensor_f64(const gdp_tensor *t) { return gdp_tensor_to_f64(t); }

size_t test_tensor_bytes(const gdp_tensor *t) { return (size_t)gdp_tensor_numel(t) * gdp_dtype_size(t->dtype); }

gdp_tensor test_copy_as(const gdp_tensor *t, gdp_dtype_t dt) {
    gdp_tensor r = test_tensor_alloc(dt, t->ndim, t->shape);
    if (dt == t->dtype)
        memcpy(r.data, t->data, test_tensor_bytes(t));
    else
        for (int64_t i = 0; i < gdp_tensor_numel(t); i++)
            gdp_tensor_set(&r, i, gdp_tensor_get(t, i));
    return r;
}

void test_fill_nan(gdp_tensor *t) {
    for (int64_t i = 0; i < gdp_tensor_numel(t); i++)
        gdp_tensor_set(t, i, NAN);
}

int64_t test_ordered_bits(gdp_dtype_t dt, const void *base, int64_t i) {
    if (dt == GDP_DTYPE_FP32) {
        uint32_t u;
        memcpy(&u, (const char *)base + 4 * i, 4);
        return (u & 0x80000000u) ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
    }
    uint16_t u;
    memcpy(&u, (const char *)base + 2 * i, 2);
    return (u & 0x8000u) ? -(int64_t)(u & 0x7fffu) : (int64_t)u;
}

int64_t test_bf16_ulp_distance(uint16_t a, uint16_t b) {
    const int64_t oa = (a & 0x8000u) ? -(int64_t)(a & 0x7fffu) : a, ob = (b & 0x8000u) ? -(int64_t)(b & 0x7fffu) : b;
    return oa > ob ? oa - ob : ob - oa;
}

const gdp_step_metadata *test_step_local(gdp_plan_t plan, gdp_cache_t cache, const gdp_step_desc *desc) {
    const gdp_step_metadata *meta = NULL;
    CHECK_OK(gdp_plan_bcast(plan, NULL, 0, desc));
    CHECK_OK(gdp_plan_build(plan, cache, NULL, &meta));
    if (meta != NULL)
        CHECK_OK(gdp_cache_apply_step(cache, meta));
    return meta;
}
