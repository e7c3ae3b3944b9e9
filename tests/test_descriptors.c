/*
 * test_descriptors.c: gdp_max_chunk_counts and gdp_build_chunk_descriptors against
 * every case of the golden descriptors.json (Megatron-LM's builder), randomized checks
 * of the invariants the kernels rely on (real rows never exceed the bounds, row
 * chunk_offsets[i] + j is (i, j), padding rows address no token), bad inputs
 * (each rejected with INVALID_ARGUMENT, a message, and nothing written), and the CUDA chunk
 * op's auto choice of kernels from the descriptors' counts and the longest sequence.
 */
#include <jansson.h> /* defines: json_load_file, json_array_get, ... */
#include <string.h>

#include "internal.h" /* gdp_chunk_auto_choose */
#include "test_common.h"

static void int_array(json_t *arr, int32_t *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(arr, i));
}

static void golden_cases(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/descriptors.json", test_golden_dir());
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    CHECK(root != NULL, "cannot read %s: %s (set GDP_GOLDEN_DIR)", path, err.text);
    if (root == NULL)
        return;
    json_t *cases = json_object_get(root, "cases");
    CHECK(json_array_size(cases) > 0, "descriptors.json has no cases");
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *cs = json_array_get(cases, c);
        json_t *jcu = json_object_get(cs, "cu_seqlens");
        int32_t n = (int32_t)json_integer_value(json_object_get(cs, "prefill_count"));
        int32_t m = (int32_t)json_integer_value(json_object_get(cs, "num_householder"));
        int64_t padded = json_integer_value(json_object_get(cs, "padded_token_count"));
        json_t *jmax = json_object_get(cs, "max_chunk_counts");
        int32_t *cu = calloc((size_t)n + 1, sizeof *cu);
        int_array(jcu, cu, (size_t)n + 1);

        int64_t mc = -1, mcdp = -1;
        CHECK_OK(gdp_max_chunk_counts(padded, n, m, &mc, &mcdp));
        CHECK(mc == json_integer_value(json_array_get(jmax, 0)) && mcdp == json_integer_value(json_array_get(jmax, 1)),
              "case %zu: max counts (%lld, %lld) differ from the golden ones", c, (long long)mc, (long long)mcdp);

        int32_t *ci = malloc(sizeof(int32_t) * 2 * (size_t)mc), *cidp = malloc(sizeof(int32_t) * 2 * (size_t)mcdp);
        int32_t *off = malloc(sizeof(int32_t) * ((size_t)n + 1));
        int64_t nc = -1, ncdp = -1;
        CHECK_OK(gdp_build_chunk_descriptors(cu, n, m, padded, ci, cidp, off, &nc, &ncdp));
        CHECK(nc == json_integer_value(json_object_get(cs, "num_chunks")), "case %zu: num_chunks %lld", c, (long long)nc);
        CHECK(ncdp == json_integer_value(json_object_get(cs, "num_chunks_dp")), "case %zu: num_chunks_dp %lld", c,
              (long long)ncdp);
        json_t *jci = json_object_get(cs, "chunk_indices"), *jcidp = json_object_get(cs, "chunk_indices_dp");
        json_t *joff = json_object_get(cs, "chunk_offsets");
        CHECK((int64_t)json_array_size(jci) == 2 * nc && (int64_t)json_array_size(jcidp) == 2 * ncdp &&
                  (int32_t)json_array_size(joff) == n + 1,
              "case %zu: golden array lengths disagree with the counts", c);
        int wrong = 0;
        for (int64_t i = 0; i < 2 * nc && i < (int64_t)json_array_size(jci); i++)
            wrong += ci[i] != json_integer_value(json_array_get(jci, (size_t)i));
        for (int64_t i = 0; i < 2 * ncdp && i < (int64_t)json_array_size(jcidp); i++)
            wrong += cidp[i] != json_integer_value(json_array_get(jcidp, (size_t)i));
        for (int32_t i = 0; i <= n && i < (int32_t)json_array_size(joff); i++)
            wrong += off[i] != json_integer_value(json_array_get(joff, (size_t)i));
        CHECK(wrong == 0, "case %zu: %d descriptor entries differ from Megatron's builder", c, wrong);
        free(cu), free(ci), free(cidp), free(off);
    }
    printf("descriptors.json: %zu golden cases compared\n", json_array_size(cases));
    json_decref(root);
}

/* Random steps: lengths from 0 to 300 (some exactly at chunk edges), M 1..5, padding
 * requests at the end and a padded token tail. */
static void randomized(void) {
    test_rng rng;
    test_rng_seed(&rng, 2026);
    for (int iter = 0; iter < 2000; iter++) {
        int32_t n = 1 + (int32_t)(test_uniform(&rng) * 12), m = 1 + (int32_t)(test_uniform(&rng) * 5);
        int32_t real = 1 + (int32_t)(test_uniform(&rng) * n);
        int32_t *cu = calloc((size_t)n + 1, sizeof *cu);
        for (int32_t i = 0; i < n; i++) {
            int32_t len = 0;
            if (i < real) {
                double u = test_uniform(&rng);
                len = u < 0.2 ? 64 * (int32_t)(1 + test_uniform(&rng) * 3) + (u < 0.1 ? 1 : -1) : (int32_t)(u * 300);
            }
            cu[i + 1] = cu[i] + len;
        }
        int64_t padded = cu[n] + (int64_t)(test_uniform(&rng) * 130);
        int64_t mc, mcdp, nc, ncdp;
        CHECK_OK(gdp_max_chunk_counts(padded, n, m, &mc, &mcdp));
        int32_t *ci = malloc(sizeof(int32_t) * 2 * (size_t)mc), *cidp = malloc(sizeof(int32_t) * 2 * (size_t)mcdp);
        int32_t *off = malloc(sizeof(int32_t) * ((size_t)n + 1));
        CHECK_OK(gdp_build_chunk_descriptors(cu, n, m, padded, ci, cidp, off, &nc, &ncdp));
        int64_t real_rows = 0, real_rows_dp = 0;
        for (int32_t i = 0; i < n; i++) {
            int64_t len = cu[i + 1] - cu[i];
            real_rows += (len + 63) / 64;
            real_rows_dp += (len * m + 63) / 64;
            CHECK(off[i + 1] - off[i] == (len + 63) / 64, "iter %d seq %d: offsets", iter, i);
            for (int32_t j = 0; j < off[i + 1] - off[i]; j++)
                CHECK(ci[2 * (off[i] + j)] == i && ci[2 * (off[i] + j) + 1] == j,
                      "iter %d: row chunk_offsets[%d] + %d is not (%d, %d)", iter, i, j, i, j);
        }
        CHECK(nc == mc && ncdp == mcdp, "iter %d: padded counts differ from gdp_max_chunk_counts", iter);
        CHECK(real_rows <= mc && real_rows_dp <= mcdp, "iter %d: real rows (%lld, %lld) exceed bounds (%lld, %lld)",
              iter, (long long)real_rows, (long long)real_rows_dp, (long long)mc, (long long)mcdp);
        /* Expanded rows: (i, j) for j < ceil(L_i M / 64), in order; padding rows address no token. */
        int64_t r = 0;
        for (int32_t i = 0; i < n; i++)
            for (int64_t j = 0; j < ((int64_t)(cu[i + 1] - cu[i]) * m + 63) / 64; j++, r++)
                CHECK(cidp[2 * r] == i && cidp[2 * r + 1] == j, "iter %d: expanded row %lld", iter, (long long)r);
        for (int64_t p = real_rows; p < nc; p++)
            CHECK(ci[2 * p] == 0 && 64LL * ci[2 * p + 1] > padded, "iter %d: padding row %lld addresses a token", iter,
                  (long long)p);
        for (int64_t p = real_rows_dp; p < ncdp; p++)
            CHECK(cidp[2 * p] == 0 && 64LL * cidp[2 * p + 1] > padded * m, "iter %d: expanded padding row %lld", iter,
                  (long long)p);
        free(cu), free(ci), free(cidp), free(off);
    }
}

/* Each bad input: INVALID_ARGUMENT, a message naming the numbers, and nothing written. */
static void bad_inputs(void) {
    int32_t ci[64], cidp[64], off[8];
    int64_t nc = 77, ncdp = 77;
    struct {
        const char *what;
        int32_t cu[5];
        int32_t n, m;
        int64_t padded;
        const char *needle;
    } cases[] = {
        {"negative length", {0, 10, 5, 20, 20}, 4, 2, 64, "sequence 1 has negative length"},
        {"cu_seqlens past the padded tokens", {0, 10, 50, 70, 70}, 4, 2, 64, "exceed padded_token_count 64"},
        {"num_householder < 1", {0, 10, 20, 30, 40}, 4, 0, 64, "num_householder is 0"},
        {"cu_seqlens[0] != 0", {3, 10, 20, 30, 40}, 4, 1, 64, "cu_seqlens[0] is 3"},
        {"negative prefill_count", {0, 0, 0, 0, 0}, -1, 1, 64, "prefill_count is -1"},
        {"negative padded tokens", {0, 0, 0, 0, 0}, 1, 1, -64, "padded_token_count is -64"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memset(ci, 0xAB, sizeof ci), memset(cidp, 0xAB, sizeof cidp), memset(off, 0xAB, sizeof off);
        gdp_status_t st = gdp_build_chunk_descriptors(cases[c].cu, cases[c].n, cases[c].m, cases[c].padded, ci, cidp,
                                                      off, &nc, &ncdp);
        CHECK(st == GDP_STATUS_INVALID_ARGUMENT, "%s: status %d", cases[c].what, (int)st);
        CHECK(strstr(gdp_last_error(), cases[c].needle) != NULL, "%s: message '%s' lacks '%s'", cases[c].what,
              gdp_last_error(), cases[c].needle);
        int touched = nc != 77 || ncdp != 77;
        for (size_t i = 0; i < 64; i++)
            touched |= ci[i] != (int32_t)0xABABABAB || cidp[i] != (int32_t)0xABABABAB;
        for (size_t i = 0; i < 8; i++)
            touched |= off[i] != (int32_t)0xABABABAB;
        CHECK(!touched, "%s: outputs were written by a failing call", cases[c].what);
    }
    int64_t a, b;
    CHECK_STATUS(gdp_max_chunk_counts(1LL << 40, 1, 4, &a, &b), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "overflows int32") != NULL, "overflow message: %s", gdp_last_error());
    CHECK_STATUS(gdp_max_chunk_counts(64, 1, 1, NULL, &b), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_build_chunk_descriptors(NULL, 1, 1, 64, ci, cidp, off, &nc, &ncdp), GDP_STATUS_INVALID_ARGUMENT);
}

/* The CUDA op's auto choice (gdp_chunk_auto_choose, descriptors.c) on the prefill rows of
 * `gdp-bench ops` as the H200 measured them (132 SMs; kernels/NOTES-chunk.md, twenty-ninth session:
 * the Hopper kernel unsplit and split, the staged chain): it must take whichever path ran fastest on
 * each measured row, choose the split's segment length the split ran with, and keep the staged chain
 * where nothing was measured (a single 1024-token prefill, the serving step's) or the longest sequence
 * is unknown. Its estimates are printed beside the measured figures. */
static int64_t expanded_chunks(const int32_t *lens, int n, int32_t m) {
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += ((int64_t)lens[i] * m + 63) / 64;
    return total;
}
static void auto_choice(void) {
    static const int32_t eight[8] = {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048};
    static const int32_t mixed[8] = {1000, 37, 5000, 64, 2500, 7000, 400, 299};
    static const int32_t one[1] = {16384}, serve[1] = {1024};
    const gdp_chunk_auto_path STAGED = GDP_CHUNK_AUTO_STAGED, HOPPER = GDP_CHUNK_AUTO_HOPPER,
                              SPLIT = GDP_CHUNK_AUTO_HOPPER_SPLIT;
    const struct {
        const char *row; /* with its measured figures: the fastest first */
        const int32_t *lens;
        int n, h, m, k, v, max_len;
        gdp_chunk_auto_path path;
        int seg;
    } rows[] = {
        {"8x2048 H16 M2 (hopper 431, staged 776 us)", eight, 8, 16, 2, 128, 128, 2048, HOPPER, 0},
        {"8x2048 H16 M3 (hopper 626, staged 1080 us)", eight, 8, 16, 3, 128, 128, 2048, HOPPER, 0},
        {"4x2048 H32 V64 M3 (hopper 553, staged 858 us)", eight, 4, 32, 3, 128, 64, 2048, HOPPER, 0},
        {"8x2048 H16 K64 M2 (hopper 374, staged 656 us)", eight, 8, 16, 2, 64, 128, 2048, HOPPER, 0},
        {"1x16384 H16 M2 (split 956, staged 1247, hopper 3294 us, H100)", one, 1, 16, 2, 128, 128, 16384, SPLIT, 56},
        {"mixed 16300 H16 M2 (split 749, staged 1089, hopper 1364 us, H100)", mixed, 8, 16, 2, 128, 128, 7000, SPLIT, 48},
        {"one 1024-token prefill, H16 M2 (not measured)", serve, 1, 16, 2, 128, 128, 1024, STAGED, 0},
        {"8x2048 H16 M2, longest unknown", eight, 8, 16, 2, 128, 128, 0, STAGED, 0},
        {"8x2048 H16 K64 V64 M2 (no measured rate)", eight, 8, 16, 2, 64, 64, 2048, STAGED, 0},
    };
    static const char *const name[3] = {"staged", "hopper", "split"};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const int64_t chunks = expanded_chunks(rows[r].lens, rows[r].n, rows[r].m);
        const gdp_chunk_auto got =
            gdp_chunk_auto_choose(chunks, rows[r].n, rows[r].h, rows[r].m, rows[r].k, rows[r].v, rows[r].max_len, 132);
        const int seg = got.path == SPLIT ? got.seg_chunks : 0;
        printf("  %-62s estimates staged %6.0f, hopper %6.0f, split %6.0f us: %s\n", rows[r].row, got.staged_us,
               got.hopper_us, got.split_us, name[got.path]);
        CHECK(got.path == rows[r].path && seg == rows[r].seg, "auto choice for %s: %s (segments of %d), expected %s (%d)",
              rows[r].row, name[got.path], seg, name[rows[r].path], rows[r].seg);
    }
    printf("  auto choice (gdp_chunk_auto_choose): %zu rows as expected\n", sizeof rows / sizeof rows[0]);
}

int main(void) {
    golden_cases();
    randomized();
    bad_inputs();
    auto_choice();
    return test_finish("test_descriptors");
}
