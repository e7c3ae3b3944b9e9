/*
 * test_common.h: what the CTest programs share: check macros that count failures,
 * seeded random inputs, the accuracy metrics of gdp-math.md section 8 (relative RMS
 * and the elementwise |a - b| <= atol + rtol |b| bar), the golden directory and
 * safetensors loading into gdp_tensor views, tensor copies, strided views, fills and the
 * per-element bar of one tensor against its reference, ulp distances, a one-process plan
 * step, and the exit codes (0 pass, 1 fail, 77 skip). The GPU tests' device helpers are in
 * test_gpu.h.
 */
#ifndef GDP_TEST_COMMON_H
#define GDP_TEST_COMMON_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gdp/cache.h"
#include "gdp/gdp.h"
#include "gdp/plan.h"
#include "safetensors.h"

#define TEST_SKIP 77

extern int g_test_failures;
extern int g_test_checks;

/* Records a failure (with file:line and a message) unless cond holds. */
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        g_test_checks++;                                                        \
        if (!(cond)) {                                                          \
            g_test_failures++;                                                  \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* Checks a gdp call returns `expect`. */
#define CHECK_STATUS(call, expect)                                              \
    do {                                                                        \
        gdp_status_t st_ = (call);                                              \
        CHECK(st_ == (expect), "%s returned %d (%s), expected %d; last error: %s", #call, (int)st_, \
              gdp_status_string(st_), (int)(expect), gdp_last_error());         \
    } while (0)
#define CHECK_OK(call) CHECK_STATUS(call, GDP_STATUS_SUCCESS)

/* Prints the summary and returns the process exit code. */
int test_finish(const char *name);

/* ---- random inputs (xorshift64*, seeded) ---- */
typedef struct { uint64_t s; } test_rng;
void   test_rng_seed(test_rng *r, uint64_t seed);
double test_uniform(test_rng *r);              /* [0, 1) */
double test_uniform_range(test_rng *r, double lo, double hi);
double test_normal(test_rng *r);

/* ---- metrics ---- */
/* ||a - b|| / ||b||; when ||b|| == 0 returns ||a - b|| (compare it against 1e-6 instead). */
double test_rel_rms(const double *a, const double *b, int64_t n);
/* Number of elements with |a - b| > atol + rtol |b| (NaN counts as bad); worst in *worst. */
int64_t test_count_bad(const double *a, const double *b, int64_t n, double atol, double rtol, int64_t *worst);
/* Applies both bars and reports with `what`; returns true when both pass. rel_bar <= 0 skips RMS. */
bool test_compare(const char *what, const double *a, const double *b, int64_t n, double rel_bar, double atol,
                  double rtol);

/* ---- golden files ---- */
/* $GDP_GOLDEN_DIR or <source>/../shared/golden. */
const char *test_golden_dir(void);
/* Opens golden file `name` (e.g. "chunk_m1_k64_single.safetensors"); a missing file is a failure. */
gdp_st_file *test_golden_open(const char *name);
/* A tensor of the file as a view over freshly malloc'd memory (free t->data). */
bool test_st_tensor(gdp_st_file *f, const char *name, gdp_tensor *t);
/* The tensor as doubles (malloc'd), n in *n. */
double *test_st_f64(gdp_st_file *f, const char *name, int64_t *n);
/* Metadata number / int ("scale": "0.125" or 0.125). */
double test_st_meta_num(gdp_st_file *f, const char *key, double dflt);
/* gated_norm.safetensors, read for the CPU and GPU norm tests: its inputs and both
 * references (malloc'd views: free each .data) and metadata. False (a failure recorded, or
 * the file missing) when it could not be read or its eps / group_size are not positive. */
typedef struct test_gated_norm_golden {
    gdp_tensor y, z, w, ref32, ref16;
    double eps;
    int64_t group;
} test_gated_norm_golden;
bool test_gated_norm_golden_read(test_gated_norm_golden *g);

/* ---- tensors ---- */
/* A malloc'd, zeroed contiguous tensor. */
gdp_tensor test_tensor_alloc(gdp_dtype_t dtype, int32_t ndim, const int64_t *shape);
/* Fills with uniform [lo, hi) values rounded to the dtype. */
void test_fill_uniform(gdp_tensor *t, test_rng *r, double lo, double hi);
double *test_tensor_f64(const gdp_tensor *t); /* contiguous double copy */
size_t test_tensor_bytes(const gdp_tensor *t);
/* A contiguous copy of t, converted to dtype dt when it differs. */
gdp_tensor test_copy_as(const gdp_tensor *t, gdp_dtype_t dt);
/* Sets every element to NaN (outputs a test expects to be written). */
void test_fill_nan(gdp_tensor *t);

/* ---- strided views, fills and bars (the GPU op tests' comparisons) ---- */
/* Bytes from the first to one past the last element of a (possibly strided) view. */
size_t test_span_bytes(const gdp_tensor *t);
/* A host copy of the view's whole span (same strides). Absent stays absent. */
gdp_tensor test_host_clone(const gdp_tensor *t);
void test_host_free(gdp_tensor *h);
/* A contiguous tensor whose rows are a view into wider rows: the last dim padded by pad. */
gdp_tensor test_alloc_rows(gdp_dtype_t dt, int32_t ndim, const int64_t *shape, int64_t pad);
void test_fill_normal(gdp_tensor *t, test_rng *r, double scale); /* scale * N(0, 1) */
void test_fill_value(gdp_tensor *t, double v);
/* A 1-d int32 tensor holding vals[0..n). */
gdp_tensor test_int_tensor(const int32_t *vals, int64_t n);
/* Largest ulp distance between two contiguous tensors of one dtype (its index in *where). */
int64_t test_max_ulp(const gdp_tensor *a, const gdp_tensor *b, int64_t *where);
/* One ulp of a 16-bit dtype at the magnitude of x (0 for fp32: no allowance). */
double test_ulp_at(gdp_dtype_t dt, double x);
/* |got - ref| <= atol + rtol |ref| + one ulp of `ulp_dtype` at ref, elementwise (NaN fails);
 * prints the largest |diff|. */
bool test_compare_bar(const char *what, const gdp_tensor *got, const gdp_tensor *ref, double atol, double rtol,
                      gdp_dtype_t ulp_dtype);
/* got vs a reference of the same dtype: fp32 within test_compare_bar(atol, rtol), a 16-bit
 * dtype within one ulp (the largest distance printed). */
void test_compare_fp32_or_1ulp(const char *what, const gdp_tensor *got, const gdp_tensor *ref, double atol,
                               double rtol);
/* The two views' spans bitwise equal (a failed check otherwise). */
bool test_same_bytes(const char *what, const gdp_tensor *a, const gdp_tensor *b);

/* ---- ulp distances ---- */
/* Element i of an fp32 (else bf16) buffer's bits as an integer monotonic in its value. */
int64_t test_ordered_bits(gdp_dtype_t dt, const void *base, int64_t i);
/* |a - b| in bf16 ulps, a and b the raw bits. */
int64_t test_bf16_ulp_distance(uint16_t a, uint16_t b);

/* ---- step plans ---- */
/* Sends desc through the plan with no comm, builds and applies it to the cache (each call
 * checked); the metadata, or NULL when the build failed. */
const gdp_step_metadata *test_step_local(gdp_plan_t plan, gdp_cache_t cache, const gdp_step_desc *desc);

/* Sets environment variable `name` (unsets it for NULL) for the calls that follow and returns
 * its previous value for test_env_restore (a malloc'd copy, NULL when it was unset). */
char *test_env_swap(const char *name, const char *value);
/* Puts back what test_env_swap saved, and frees it. */
void test_env_restore(const char *name, char *saved);

#endif /* GDP_TEST_COMMON_H */
