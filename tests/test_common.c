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

bool test_gated_norm_golden_read(test_gated_norm_golden *g) {
    memset(g, 0, sizeof *g);
    gdp_st_file *f = test_golden_open("gated_norm.safetensors");
    if (f == NULL)
        return false;
    const bool ok = test_st_tensor(f, "y", &g->y) && test_st_tensor(f, "z", &g->z) && test_st_tensor(f, "weight", &g->w) &&
                    test_st_tensor(f, "out_ref", &g->ref32) && test_st_tensor(f, "out_bf16_ref", &g->ref16);
    g->eps = test_st_meta_num(f, "eps", -1);
    g->group = (int64_t)test_st_meta_num(f, "group_size", 0);
    gdp_st_close(f);
    if (!ok)
        return false;
    CHECK(g->eps > 0 && g->group > 0, "gated_norm metadata: eps %g, group_size %lld", g->eps, (long long)g->group);
    return g->eps > 0 && g->group > 0;
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

/* ---- strided views, fills and bars of one tensor against its reference ---- */

/* Bytes from the first to one past the last element of a (possibly strided) view. */
size_t test_span_bytes(const gdp_tensor *t) {
    int64_t span = 1;
    for (int32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0)
            return 0;
        span += (t->shape[d] - 1) * gdp_tensor_stride(t, d);
    }
    return (size_t)span * gdp_dtype_size(t->dtype);
}

/* A host copy of the view's whole span (same strides). Absent stays absent. */
gdp_tensor test_host_clone(const gdp_tensor *t) {
    gdp_tensor r = *t;
    if (!gdp_tensor_present(t))
        return r;
    const size_t b = test_span_bytes(t);
    r.data = malloc(b ? b : 1);
    memcpy(r.data, t->data, b);
    return r;
}

void test_host_free(gdp_tensor *h) {
    free(h->data);
    h->data = NULL;
}

/* A contiguous tensor whose rows are a view into wider rows: the last dim padded by pad. */
gdp_tensor test_alloc_rows(gdp_dtype_t dt, int32_t ndim, const int64_t *shape, int64_t pad) {
    gdp_tensor t = test_tensor_alloc(dt, ndim, shape);
    if (pad == 0)
        return t;
    free(t.data);
    int64_t stride = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        t.stride[d] = stride;
        stride *= d == ndim - 1 ? shape[d] + pad : shape[d];
    }
    t.data = calloc((size_t)stride, gdp_dtype_size(dt));
    return t;
}

void test_fill_normal(gdp_tensor *t, test_rng *r, double scale) {
    for (int64_t i = 0; i < gdp_tensor_numel(t); i++)
        gdp_tensor_set(t, i, scale * test_normal(r));
}

void test_fill_value(gdp_tensor *t, double v) {
    for (int64_t i = 0; i < gdp_tensor_numel(t); i++)
        gdp_tensor_set(t, i, v);
}

gdp_tensor test_int_tensor(const int32_t *vals, int64_t n) {
    const int64_t shape[1] = {n};
    gdp_tensor t = test_tensor_alloc(GDP_DTYPE_INT32, 1, shape);
    memcpy(t.data, vals, (size_t)n * sizeof(int32_t));
    return t;
}

/* Largest ulp distance between two contiguous tensors of one dtype. */
int64_t test_max_ulp(const gdp_tensor *a, const gdp_tensor *b, int64_t *where) {
    int64_t worst = 0;
    *where = 0;
    for (int64_t i = 0; i < gdp_tensor_numel(a); i++) {
        int64_t d = test_ordered_bits(a->dtype, a->data, i) - test_ordered_bits(b->dtype, b->data, i);
        d = d < 0 ? -d : d;
        if (d > worst) {
            worst = d;
            *where = i;
        }
    }
    return worst;
}

/* One ulp of a 16-bit dtype at the magnitude of x (0 for fp32: no allowance). */
double test_ulp_at(gdp_dtype_t dt, double x) {
    if (dt == GDP_DTYPE_FP32)
        return 0.0;
    const int mant = dt == GDP_DTYPE_BF16 ? 7 : 10;
    const int min_exp = dt == GDP_DTYPE_BF16 ? -126 : -14;
    int e;
    frexp(fabs(x), &e); /* |x| in [2^(e-1), 2^e) */
    int lead = e - 1;
    if (x == 0 || lead < min_exp)
        lead = min_exp;
    return ldexp(1.0, lead - mant);
}

/* |got - ref| <= atol + rtol |ref| + one ulp of `ulp_dtype` at ref, elementwise (NaN fails). */
bool test_compare_bar(const char *what, const gdp_tensor *got, const gdp_tensor *ref, double atol, double rtol,
                      gdp_dtype_t ulp_dtype) {
    const int64_t n = gdp_tensor_numel(ref);
    CHECK(gdp_tensor_numel(got) == n, "%s: %lld elements, reference %lld", what, (long long)gdp_tensor_numel(got),
          (long long)n);
    int64_t bad = 0, worst = -1;
    double worst_excess = -1, max_abs = 0;
    for (int64_t i = 0; i < n && gdp_tensor_numel(got) == n; i++) {
        const double a = gdp_tensor_get(got, i), b = gdp_tensor_get(ref, i);
        const double d = fabs(a - b), bar = atol + rtol * fabs(b) + test_ulp_at(ulp_dtype, b);
        if (!(d <= bar)) {
            bad++;
            const double excess = isnan(d) ? INFINITY : d - bar;
            if (excess > worst_excess) {
                worst_excess = excess;
                worst = i;
            }
        }
        if (d > max_abs)
            max_abs = d;
    }
    CHECK(bad == 0, "%s: %lld of %lld elements outside atol %.0e rtol %.0e%s; worst [%lld] got %.9g want %.9g", what,
          (long long)bad, (long long)n, atol, rtol, ulp_dtype == GDP_DTYPE_FP32 ? "" : " + 1 ulp", (long long)worst,
          worst >= 0 ? gdp_tensor_get(got, worst) : 0.0, worst >= 0 ? gdp_tensor_get(ref, worst) : 0.0);
    printf("  %-58s max |diff| %.2e over %lld elements\n", what, max_abs, (long long)n);
    return bad == 0;
}

bool test_same_bytes(const char *what, const gdp_tensor *a, const gdp_tensor *b) {
    const size_t na = test_span_bytes(a), nb = test_span_bytes(b);
    const bool ok = na == nb && memcmp(a->data, b->data, na) == 0;
    CHECK(ok, "%s: not bitwise equal (%zu vs %zu bytes)", what, na, nb);
    return ok;
}

void test_compare_fp32_or_1ulp(const char *what, const gdp_tensor *got, const gdp_tensor *ref, double atol,
                               double rtol) {
    if (got->dtype == GDP_DTYPE_FP32) {
        test_compare_bar(what, got, ref, atol, rtol, GDP_DTYPE_FP32);
        return;
    }
    int64_t where;
    const int64_t ulp = test_max_ulp(got, ref, &where);
    CHECK(ulp <= 1, "%s: %lld ulp at [%lld] (got %.9g, want %.9g); bar 1 ulp", what, (long long)ulp, (long long)where,
          gdp_tensor_get(got, where), gdp_tensor_get(ref, where));
    printf("  %-58s max %lld ulp over %lld elements\n", what, (long long)ulp, (long long)gdp_tensor_numel(got));
}

char *test_env_swap(const char *name, const char *value) {
    const char *was = getenv(name);
    char *saved = was != NULL ? strdup(was) : NULL;
    if (value != NULL)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return saved;
}

void test_env_restore(const char *name, char *saved) {
    if (saved != NULL)
        setenv(name, saved, 1);
    else
        unsetenv(name);
    free(saved);
}
