/*
 * test_safetensors.c: the safetensors reader's strictness on hand-made headers: the layout
 * rule of the format (tensor byte ranges tile the data buffer: no overlap, no gap, no
 * trailing bytes; header order free), duplicate names, a header that is not a JSON object,
 * shapes whose size overflows 64 bits, and the writer refusing duplicate names and
 * overflowing shapes. Each bad file must fail with INVALID_ARGUMENT and a message naming
 * the tensor(s), never open.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "test_common.h"

static char g_path[256];

/* A file of: the 8-byte header length, `header`, then `data` (data_len bytes; NULL: zeros). */
static void write_raw(const char *header, size_t hlen, const void *data, size_t data_len) {
    FILE *f = fopen(g_path, "wb");
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(((uint64_t)hlen >> (8 * i)) & 0xff);
    fwrite(len8, 1, 8, f);
    fwrite(header, 1, hlen, f);
    for (size_t i = 0; i < data_len; i++)
        fputc(data ? ((const unsigned char *)data)[i] : 0, f);
    fclose(f);
}

/* Opening the file must fail with INVALID_ARGUMENT and a message holding every needle. */
static void expect_bad(const char *what, const char *header, size_t data_len, const char *n1, const char *n2,
                       const char *n3) {
    write_raw(header, strlen(header), NULL, data_len);
    gdp_st_file *f = NULL;
    gdp_status_t st = gdp_st_open(g_path, &f);
    const char *msg = gdp_last_error();
    CHECK(st == GDP_STATUS_INVALID_ARGUMENT && f == NULL, "%s: gdp_st_open returned %d (%s)", what, (int)st, msg);
    const char *needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i] != NULL)
            CHECK(strstr(msg, needles[i]) != NULL, "%s: the message lacks \"%s\": %s", what, needles[i], msg);
    CHECK(strstr(msg, "line -1") == NULL && strstr(msg, "(, ") == NULL, "%s: an empty parser message: %s", what, msg);
    gdp_st_close(f);
}

static gdp_st_file *expect_good(const char *what, const char *header, const void *data, size_t data_len) {
    write_raw(header, strlen(header), data, data_len);
    gdp_st_file *f = NULL;
    CHECK_OK(gdp_st_open(g_path, &f));
    CHECK(f != NULL, "%s: the file did not open", what);
    return f;
}

#define T(name, dtype, shape, b, e) "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void header_shape(void) {
    /* A JSON array parses but is not an object: the message says so (it used to print the
     * parser's empty error text "(, line -1)"). */
    expect_bad("array header", "[1, 2, 3]", 0, "'['", "JSON array", "JSON object");
    expect_bad("scalar header", "42      ", 0, "does not start with '{'", NULL, NULL);
    expect_bad("empty header", "", 0, "empty", NULL, NULL);
    expect_bad("leading space", " {}", 0, "does not start with '{'", NULL, NULL);
    expect_bad("invalid JSON", "{\"a\": ", 0, "not valid JSON", "column", NULL);
    /* Padding with spaces after the object is allowed (the writer pads to 8 bytes). */
    gdp_st_file *f = expect_good("padded header", "{}      ", NULL, 0);
    gdp_st_close(f);
}

static void layout(void) {
    const float vals[3] = {1.5f, -2.0f, 3.25f};
    /* Tiling in header order. */
    gdp_st_file *f = expect_good("tiled", "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[1]", 8, 12) "}", vals,
                                 12);
    gdp_st_close(f);
    /* Header order is free: the ranges still tile once sorted, and each tensor reads its bytes. */
    f = expect_good("unsorted header", "{" T("b", "F32", "[1]", 8, 12) "," T("a", "F32", "[2]", 0, 8) "}", vals, 12);
    if (f != NULL) {
        float a[2] = {0}, b = 0;
        CHECK_OK(gdp_st_read(f, "a", a, sizeof a));
        CHECK_OK(gdp_st_read(f, "b", &b, sizeof b));
        CHECK(a[0] == 1.5f && a[1] == -2.0f && b == 3.25f, "unsorted header read a = {%g, %g}, b = %g", a[0], a[1],
              b);
        gdp_st_close(f);
    }
    /* Empty tensors take no bytes and may sit anywhere their offset matches. */
    f = expect_good("empty tensors",
                    "{" T("z0", "F32", "[0]", 0, 0) "," T("a", "F32", "[2]", 0, 8) "," T("z1", "BF16", "[3, 0]", 8, 8)
                    "," T("b", "F32", "[1]", 8, 12) "}",
                    vals, 12);
    gdp_st_close(f);
    /* Metadata only: no tensor, no data. */
    f = expect_good("metadata only", "{\"__metadata__\":{\"k\":\"v\"}}", NULL, 0);
    gdp_st_close(f);

    expect_bad("overlap", "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", 12, "'b'", "'a'",
               "overlap");
    expect_bad("same range twice", "{" T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 0, 8) "}", 8, "overlap",
               "'a'", "'b'");
    expect_bad("gap", "{" T("a", "F32", "[1]", 0, 4) "," T("b", "F32", "[1]", 8, 12) "}", 12, "'b'", "'a'", "gaps");
    expect_bad("leading gap", "{" T("a", "F32", "[1]", 4, 8) "}", 8, "'a'", "not 0", "gaps");
    expect_bad("trailing bytes", "{" T("a", "F32", "[1]", 0, 4) "}", 8, "'a'", "trailing", "8 data bytes");
    expect_bad("data without tensors", "{}", 4, "no tensor", "4 data bytes", NULL);
    /* The per-tensor checks still come first: a size mismatch and data past the end. */
    expect_bad("size mismatch", "{" T("a", "F32", "[2]", 0, 4) "}", 4, "'a'", "do not match", NULL);
    expect_bad("past the end", "{" T("a", "F32", "[2]", 0, 8) "}", 4, "'a'", "truncated", NULL);
}

static void duplicates(void) {
    /* jansson would keep the last of two equal keys: the format forbids duplicates. */
    expect_bad("duplicate name", "{" T("w", "F32", "[1]", 0, 4) "," T("w", "F32", "[1]", 4, 8) "}", 8, "twice", "w",
               "duplicate");
}

static void overflow(void) {
    /* 2^32 x 2^32 elements wrap an int64 product to 0, which once matched [0, 0]. */
    expect_bad("shape 2^32 x 2^32", "{" T("big", "F32", "[4294967296, 4294967296]", 0, 0) "}", 0, "'big'",
               "overflows", "[4294967296, 4294967296]");
    expect_bad("shape 2^31^3 of bytes", "{" T("big", "U8", "[2147483648, 2147483648, 2147483648]", 0, 0) "}", 0,
               "'big'", "overflows", NULL);
    /* The element count fits but the bytes do not: 2^62 fp32 values. */
    expect_bad("bytes 2^64", "{" T("big", "F32", "[4611686018427387904]", 0, 0) "}", 0, "'big'", "overflows", NULL);
    /* A zero extent anywhere makes the tensor empty, however big the others are. */
    gdp_st_file *f = expect_good("huge but empty", "{" T("e", "F32", "[0, 4294967296, 4294967296]", 0, 0) "}",
                                 NULL, 0);
    if (f != NULL) {
        const gdp_st_info *e = gdp_st_find(f, "e");
        CHECK(e != NULL && e->numel == 0 && e->nbytes == 0, "empty huge tensor: numel %lld",
              e ? (long long)e->numel : -1LL);
        gdp_st_close(f);
    }
    /* A slice request whose end overflows int64 is refused, not wrapped. */
    const float vals[2] = {1, 2};
    f = expect_good("slice base", "{" T("a", "F32", "[2]", 0, 8) "}", vals, 8);
    if (f != NULL) {
        float x = 0;
        CHECK_STATUS(gdp_st_read_slice(f, "a", 0, 1, INT64_MAX, &x, sizeof x), GDP_STATUS_INVALID_ARGUMENT);
        gdp_st_close(f);
    }
}

static void writer(void) {
    float a[2] = {1, 2};
    gdp_st_entry dup[2] = {{"x", GDP_DTYPE_FP32, 1, {2}, a}, {"x", GDP_DTYPE_FP32, 1, {2}, a}};
    CHECK_STATUS(gdp_st_write(g_path, dup, 2, NULL, NULL, 0), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "'x'") && strstr(gdp_last_error(), "twice"), "duplicate write: %s",
          gdp_last_error());
    gdp_st_entry meta_name[1] = {{"__metadata__", GDP_DTYPE_FP32, 1, {2}, a}};
    CHECK_STATUS(gdp_st_write(g_path, meta_name, 1, NULL, NULL, 0), GDP_STATUS_INVALID_ARGUMENT);
    gdp_st_entry huge[1] = {{"h", GDP_DTYPE_FP32, 2, {(int64_t)1 << 32, (int64_t)1 << 32}, a}};
    CHECK_STATUS(gdp_st_write(g_path, huge, 1, NULL, NULL, 0), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "'h'") && strstr(gdp_last_error(), "overflows"), "overflowing write: %s",
          gdp_last_error());
}

int main(void) {
    snprintf(g_path, sizeof g_path, "/tmp/gdp_test_safetensors_%d.safetensors", (int)getpid());
    header_shape();
    layout();
    duplicates();
    overflow();
    writer();
    unlink(g_path);
    return test_finish("test_safetensors");
}
