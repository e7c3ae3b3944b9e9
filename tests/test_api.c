/*
 * test_api.c: the API basics: version, status strings, dtypes and their round-to-
 * nearest-even conversions, tensor views, contexts, and the safetensors reader and
 * writer (round trip, slices along a dim, metadata, and corrupt files rejected with a
 * message instead of a crash).
 */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "gdp/config.h"
#include "internal.h"
#include "test_common.h"

static void version_and_status(void) {
    int v = 0;
    CHECK_OK(gdp_get_version(&v));
    CHECK(v == GDP_VERSION_CODE, "gdp_get_version gave %d, header says %d", v, GDP_VERSION_CODE);
    CHECK(GDP_VERSION(1, 2, 3) == 10203, "GDP_VERSION(1,2,3) = %d", GDP_VERSION(1, 2, 3));
    for (int s = 0; s < GDP_STATUS_NUM; s++) {
        const char *str = gdp_status_string((gdp_status_t)s);
        CHECK(str != NULL && strlen(str) > 5, "status %d has no string", s);
        for (int t = 0; t < s; t++)
            CHECK(strcmp(str, gdp_status_string((gdp_status_t)t)) != 0, "statuses %d and %d share a string", s, t);
    }
    CHECK(gdp_status_string((gdp_status_t)999) != NULL, "unknown status gives NULL");
    CHECK_STATUS(gdp_get_version(NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "gdp_get_version") != NULL, "message lacks the function: %s", gdp_last_error());
}

static void dtypes(void) {
    CHECK(gdp_dtype_size(GDP_DTYPE_FP32) == 4 && gdp_dtype_size(GDP_DTYPE_BF16) == 2 &&
              gdp_dtype_size(GDP_DTYPE_FP16) == 2 && gdp_dtype_size(GDP_DTYPE_INT32) == 4 &&
              gdp_dtype_size(GDP_DTYPE_NUM) == 0,
          "dtype sizes");
    CHECK(strcmp(gdp_dtype_name(GDP_DTYPE_BF16), "bf16") == 0, "bf16 name");
    /* bf16: every bf16 value round-trips; values between two neighbours round to the
     * nearer one and ties go to the even mantissa. */
    test_rng rng;
    test_rng_seed(&rng, 7);
    int bad = 0;
    for (int i = 0; i < 100000; i++) {
        uint16_t lo = (uint16_t)(test_uniform(&rng) * 0x7f7f);
        uint16_t hi = lo + 1;
        float a = gdp_bf16_to_float(lo), b = gdp_bf16_to_float(hi);
        bad += gdp_float_to_bf16(a) != lo;
        float mid = (float)(((double)a + (double)b) / 2); /* exact in fp32 */
        bad += gdp_float_to_bf16(mid) != ((lo & 1) ? hi : lo);
        float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
        bad += gdp_float_to_bf16(below) != lo || gdp_float_to_bf16(above) != hi;
        /* double -> bf16 must not double-round through float. */
        double just_above = (double)mid + ((double)b - (double)a) * 1e-6;
        bad += gdp_double_to_bf16(just_above) != hi;
    }
    CHECK(bad == 0, "%d bf16 rounding errors", bad);
    CHECK(isnan(gdp_bf16_to_float(gdp_float_to_bf16(NAN))), "NaN survives bf16");
    CHECK(gdp_bf16_to_float(gdp_float_to_bf16(INFINITY)) == INFINITY, "inf survives bf16");
    bad = 0;
    for (int i = 0; i < 0x7c00; i++)
        bad += gdp_float_to_fp16(gdp_fp16_to_float((uint16_t)i)) != i;
    CHECK(bad == 0, "%d fp16 values do not round-trip", bad);
}

static void tensors_and_ctx(void) {
    gdp_tensor t;
    int64_t shape[3] = {2, 3, 4};
    float buf[24];
    CHECK_OK(gdp_tensor_init(&t, buf, GDP_DTYPE_FP32, 3, shape));
    CHECK(gdp_tensor_numel(&t) == 24 && gdp_tensor_is_contiguous(&t), "numel/contiguous");
    int64_t neg[2] = {2, -1};
    CHECK_STATUS(gdp_tensor_init(&t, buf, GDP_DTYPE_FP32, 2, neg), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_tensor_init(&t, buf, GDP_DTYPE_FP32, 9, shape), GDP_STATUS_INVALID_ARGUMENT);
    /* Strided view: every other row of a [4, 4] buffer. */
    for (int i = 0; i < 24; i++)
        buf[i] = (float)i;
    int64_t s2[2] = {2, 4};
    gdp_tensor v;
    gdp_tensor_init(&v, buf, GDP_DTYPE_FP32, 2, s2);
    v.stride[0] = 8, v.stride[1] = 1;
    CHECK(!gdp_tensor_is_contiguous(&v), "strided view reported contiguous");
    CHECK(gdp_tensor_get(&v, 5) == 9.0, "strided element [1][1] = %g, want 9", gdp_tensor_get(&v, 5));
    int64_t want[3] = {2, 3, 5};
    CHECK_OK(gdp_tensor_init(&t, buf, GDP_DTYPE_FP32, 3, shape));
    CHECK_STATUS(gdp_check_tensor("op", "x", &t, 3, want, GDP_DT_FLOAT), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "x has shape [2, 3, 4], expected [2, 3, 5]") != NULL, "shape message: %s",
          gdp_last_error());
    CHECK_STATUS(gdp_check_tensor("op", "x", &t, 3, shape, GDP_DT_HALF), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "dtype fp32, expected bf16 or fp16") != NULL, "dtype message: %s",
          gdp_last_error());

    gdp_ctx_t ctx = NULL;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    gdp_backend_t b = GDP_BACKEND_NUM;
    CHECK_OK(gdp_ctx_get_backend(ctx, &b));
    CHECK(b == GDP_BACKEND_CPU, "backend %d", (int)b);
    CHECK_OK(gdp_ctx_free(ctx));
    CHECK_OK(gdp_ctx_free(NULL));
    CHECK_STATUS(gdp_ctx_init(&ctx, (gdp_backend_t)7, 0), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(ctx == NULL, "failed init left a ctx");
    /* A CUDA ctx either works (GPU present) or fails cleanly with a message. */
    gdp_status_t st = gdp_ctx_init(&ctx, GDP_BACKEND_CUDA, 0);
    CHECK(st == GDP_STATUS_SUCCESS || (ctx == NULL && strlen(gdp_last_error()) > 0), "CUDA ctx init: %s",
          gdp_last_error());
    gdp_ctx_free(ctx);
    CHECK_STATUS(gdp_ctx_set_stream(NULL, NULL), GDP_STATUS_INVALID_ARGUMENT);
}

/* Sizes from a file or a user never overflow silently: gdp_tensor_init refuses a shape whose
 * bytes exceed int64, gdp_tensor_numel saturates on a hand-made view, and the op checks refuse
 * such a view (or strides that address past int64) naming the tensor. */
static void size_overflow(void) {
    gdp_tensor t;
    float x[4] = {0};
    const int64_t huge[2] = {(int64_t)1 << 32, (int64_t)1 << 32}, bytes_huge[1] = {(int64_t)1 << 62};
    CHECK_STATUS(gdp_tensor_init(&t, x, GDP_DTYPE_FP32, 2, huge), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "[4294967296, 4294967296]") && strstr(gdp_last_error(), "2^63"),
          "overflowing shape message: %s", gdp_last_error());
    CHECK_STATUS(gdp_tensor_init(&t, x, GDP_DTYPE_FP32, 1, bytes_huge), GDP_STATUS_INVALID_ARGUMENT);
    const int64_t ok_shape[1] = {(int64_t)1 << 60};
    CHECK_OK(gdp_tensor_init(&t, x, GDP_DTYPE_FP32, 1, ok_shape)); /* 2^62 bytes fit int64: only a view */
    gdp_tensor v;
    memset(&v, 0, sizeof v);
    v.data = x, v.dtype = GDP_DTYPE_FP32, v.ndim = 3;
    v.shape[0] = (int64_t)1 << 32, v.shape[1] = (int64_t)1 << 32, v.shape[2] = 4;
    CHECK(gdp_tensor_numel(&v) == INT64_MAX, "numel of an overflowing view: %lld", (long long)gdp_tensor_numel(&v));
    const int64_t any3[3] = {GDP_ANY, GDP_ANY, GDP_ANY};
    CHECK_STATUS(gdp_check_tensor("op", "q", &v, 3, any3, GDP_DT_FLOAT), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "op: q has shape [4294967296, 4294967296, 4]") &&
              strstr(gdp_last_error(), "overflows"),
          "overflowing view message: %s", gdp_last_error());
    v.shape[0] = 2, v.shape[1] = 2, v.shape[2] = 1;
    CHECK_OK(gdp_check_tensor("op", "q", &v, 3, any3, GDP_DT_FLOAT));
    v.stride[0] = INT64_MAX / 2, v.stride[1] = 1, v.stride[2] = 1;
    CHECK_STATUS(gdp_check_tensor("op", "q", &v, 3, any3, GDP_DT_FLOAT), GDP_STATUS_INVALID_ARGUMENT);
}

static void safetensors(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/gdp_test_api_%d.safetensors", (int)getpid());
    float a[2][3] = {{1, 2, 3}, {4, 5, 6}};
    int32_t b[4] = {7, -8, 9, 10};
    uint16_t c[3] = {gdp_float_to_bf16(1.5f), gdp_float_to_bf16(-2.0f), gdp_float_to_bf16(0.25f)};
    gdp_st_entry e[3] = {{"a", GDP_DTYPE_FP32, 2, {2, 3}, a}, {"b", GDP_DTYPE_INT32, 1, {4}, b},
                         {"c", GDP_DTYPE_BF16, 1, {3}, c}};
    const char *mk[1] = {"op"}, *mv[1] = {"unit"};
    CHECK_OK(gdp_st_write(path, e, 3, mk, mv, 1));
    gdp_st_file *f = NULL;
    CHECK_OK(gdp_st_open(path, &f));
    if (f == NULL)
        return;
    CHECK(gdp_st_count(f) == 3, "count %d", gdp_st_count(f));
    CHECK(gdp_st_metadata(f, "op") && strcmp(gdp_st_metadata(f, "op"), "unit") == 0, "metadata");
    const gdp_st_info *ia = gdp_st_find(f, "a");
    CHECK(ia && ia->dtype == GDP_DTYPE_FP32 && ia->ndim == 2 && ia->shape[1] == 3, "info of a");
    float col[2];
    CHECK_OK(gdp_st_read_slice(f, "a", 1, 1, 1, col, sizeof col));
    CHECK(col[0] == 2 && col[1] == 5, "slice of column 1: %g %g", col[0], col[1]);
    int32_t rb[4];
    CHECK_OK(gdp_st_read(f, "b", rb, sizeof rb));
    CHECK(memcmp(rb, b, sizeof b) == 0, "b round trip");
    uint16_t rc[3];
    CHECK_OK(gdp_st_read(f, "c", rc, sizeof rc));
    CHECK(memcmp(rc, c, sizeof c) == 0, "c round trip");
    CHECK_STATUS(gdp_st_read(f, "b", rb, 8), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_st_read(f, "missing", rb, 8), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "no tensor named 'missing'") != NULL, "%s", gdp_last_error());
    CHECK_STATUS(gdp_st_read_slice(f, "a", 0, 1, 2, col, sizeof col), GDP_STATUS_INVALID_ARGUMENT);
    gdp_st_close(f);

    /* Truncated copy: the header promises data past the end. */
    FILE *in = fopen(path, "rb");
    char bytes[4096];
    size_t n = fread(bytes, 1, sizeof bytes, in);
    fclose(in);
    char bad[300];
    snprintf(bad, sizeof bad, "%s.trunc", path);
    FILE *out = fopen(bad, "wb");
    fwrite(bytes, 1, n - 5, out);
    fclose(out);
    CHECK_STATUS(gdp_st_open(bad, &f), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "truncated") != NULL, "truncation message: %s", gdp_last_error());
    /* Garbage header length. */
    out = fopen(bad, "wb");
    fwrite("\xff\xff\xff\xff\xff\xff\x00\x00{}", 1, 10, out);
    fclose(out);
    CHECK_STATUS(gdp_st_open(bad, &f), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_st_open("/nonexistent/x.safetensors", &f), GDP_STATUS_SYSTEM_ERROR);
    /* A tensor of a dtype gdp does not know: the file opens, the other tensors read, that one
     * fails with a message naming its dtype. */
    const char *hdr = "{\"odd\":{\"dtype\":\"F4_NEW\",\"shape\":[2],\"data_offsets\":[0,1]},"
                      "\"x\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[1,5]}}";
    out = fopen(bad, "wb");
    unsigned char len8[8] = {0};
    len8[0] = (unsigned char)strlen(hdr);
    int32_t xval = 42;
    fwrite(len8, 1, 8, out), fwrite(hdr, 1, strlen(hdr), out), fputc(0x5a, out), fwrite(&xval, 4, 1, out);
    fclose(out);
    CHECK_OK(gdp_st_open(bad, &f));
    if (f != NULL) {
        int32_t xr = 0;
        uint8_t odd = 0;
        CHECK_OK(gdp_st_read(f, "x", &xr, sizeof xr));
        CHECK(xr == 42, "x read %d", xr);
        CHECK_STATUS(gdp_st_read(f, "odd", &odd, 1), GDP_STATUS_UNSUPPORTED);
        CHECK(strstr(gdp_last_error(), "F4_NEW") != NULL, "unknown dtype message: %s", gdp_last_error());
        gdp_st_close(f);
    }
    unlink(bad);
    unlink(path);
}

/* A layer config's norm epsilons must be finite and > 0 (an infinite eps zeroes every norm). */
static void valid_config(gdp_layer_config *c) {
    CHECK_OK(gdp_layer_config_default(c));
    c->hidden_size = 64, c->num_heads = 2, c->num_groups = 1, c->head_dim = 16, c->state_dim = 16;
    c->num_householder = 2, c->num_layers = 1;
}

static void config_eps(void) {
    gdp_layer_config c;
    valid_config(&c);
    CHECK_OK(gdp_layer_config_validate(&c));
    c.norm_eps = INFINITY;
    CHECK_STATUS(gdp_layer_config_validate(&c), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "finite") != NULL, "the message says why: %s", gdp_last_error());
    valid_config(&c);
    c.out_norm_eps = NAN;
    CHECK_STATUS(gdp_layer_config_validate(&c), GDP_STATUS_INVALID_ARGUMENT);
}

int main(void) {
    config_eps();
    version_and_status();
    dtypes();
    tensors_and_ctx();
    size_overflow();
    safetensors();
    return test_finish("test_api");
}
