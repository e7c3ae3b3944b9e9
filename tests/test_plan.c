/*
 * test_plan.c: the step plan.
 *   one process (label cpu): config errors; the metadata of a mixed step (decode with
 *     draft tokens, prefills with snapshot saves) against what its definition implies:
 *     the bucket chosen, slot arrays padded with -1, cu_seqlens padded by repeating the
 *     last value, chunk descriptors equal to gdp_build_chunk_descriptors on those
 *     cu_seqlens, conv per-token metadata, snapshot rows, all arrays in one buffer; and
 *     every refused step (slot exhaustion, a step that does not fit its bucket or any,
 *     bad slots, snapshots and offsets) refused with its numbers named and nothing
 *     modified (cache slot table, previous metadata).
 *   --mpi (label mpi, under mpirun): the root's step reaches every rank (roots 0 and
 *     size-1); a root whose step is invalid fails on every rank (REMOTE_ERROR carrying
 *     its message); slot exhaustion and an unfitting bucket fail on every rank; the debug
 *     hash check passes when ranks agree and fails on every rank (INVALID_USAGE) when one
 *     rank's cache diverged; a divergence that makes one rank fail its validation makes
 *     every rank fail (no rank waits). Failure counts are summed over the ranks.
 */
#include <mpi.h>
#include <string.h>

#include "gdp/cache.h"
#include "gdp/comm.h"
#include "gdp/plan.h"
#include "test_common.h"

#define M_COPIES 3
#define N_SLOTS 8

static gdp_ctx_t g_ctx;
static int g_rank = 0, g_size = 1;

static const gdp_step_bucket k_buckets[] = {{2, 2, 64}, {4, 4, 512}, {4, 4, 256}, {8, 8, 512}};
#define N_BUCKETS ((int32_t)(sizeof k_buckets / sizeof k_buckets[0]))

static gdp_cache_t make_cache(void) {
    gdp_cache_config c = {.num_layers = 1, .n_slots = N_SLOTS, .num_heads = 2, .state_dim = 8, .head_dim = 8,
                          .conv_dim = 16, .conv_width = 4, .ssm_dtype = GDP_DTYPE_FP32,
                          .conv_dtype = GDP_DTYPE_FP32, .max_draft_tokens = 3, .n_snapshots = 4};
    gdp_cache_t cache = NULL;
    CHECK_OK(gdp_cache_init(&cache, g_ctx, &c));
    return cache;
}

static gdp_plan_t make_plan(int32_t debug) {
    gdp_plan_config pc = {.num_householder = M_COPIES, .n_slots = N_SLOTS, .max_decode_tokens = 3,
                          .n_buckets = N_BUCKETS, .buckets = k_buckets, .debug_check = debug};
    gdp_plan_t plan = NULL;
    CHECK_OK(gdp_plan_init(&plan, g_ctx, &pc));
    return plan;
}

static void claim(gdp_plan_t plan, gdp_cache_t cache, int32_t n) {
    gdp_prefill_request p[N_SLOTS];
    for (int32_t i = 0; i < n; i++)
        p[i] = (gdp_prefill_request){.slot = GDP_SLOT_AUTO, .n_tokens = 1, .flags = GDP_PREFILL_NEW};
    gdp_step_desc d = {.prefill_count = n, .prefill = p, .bucket = GDP_BUCKET_AUTO};
    test_step_local(plan, cache, &d);
}

static bool contains(const char *msg, const char *needle) { return strstr(msg, needle) != NULL; }

/* ---- one process ------------------------------------------------------------------------ */

static void test_config_errors(void) {
    gdp_plan_t plan = (gdp_plan_t)&plan;
    gdp_plan_config good = {.num_householder = 2, .n_slots = 4, .max_decode_tokens = 1, .n_buckets = 1,
                            .buckets = k_buckets};
    struct { const char *what; gdp_plan_config c; const char *needle; } cases[5];
    for (int i = 0; i < 5; i++)
        cases[i].c = good;
    cases[0].what = "M = 0", cases[0].c.num_householder = 0, cases[0].needle = "num_householder";
    cases[1].what = "no slots", cases[1].c.n_slots = 0, cases[1].needle = "n_slots";
    cases[2].what = "S = 0", cases[2].c.max_decode_tokens = 0, cases[2].needle = "max_decode_tokens";
    cases[3].what = "no buckets", cases[3].c.n_buckets = 0, cases[3].needle = "buckets";
    const gdp_step_bucket bad = {3, 1, 2};
    cases[4].what = "bucket with more decode requests than rows", cases[4].c.buckets = &bad,
    cases[4].needle = "bucket 0";
    for (int i = 0; i < 5; i++) {
        CHECK_STATUS(gdp_plan_init(&plan, g_ctx, &cases[i].c), GDP_STATUS_INVALID_ARGUMENT);
        CHECK(plan == NULL, "%s: *out not reset", cases[i].what);
        CHECK(contains(gdp_last_error(), cases[i].needle), "%s: message '%s' lacks '%s'", cases[i].what,
              gdp_last_error(), cases[i].needle);
    }
    printf("config errors: %d refused, naming the field\n", 5);
}

/* The bucket GDP_BUCKET_AUTO must pick: the fitting one with the fewest rows. */
static int32_t expected_bucket(int32_t dc, int32_t S, int32_t pc, int64_t tokens) {
    int32_t best = -1;
    for (int32_t b = 0; b < N_BUCKETS; b++) {
        const gdp_step_bucket *k = &k_buckets[b];
        if (dc <= k->decode_count && pc <= k->prefill_count && (int64_t)k->decode_count * S + tokens <= k->token_count &&
            (best < 0 || k->token_count < k_buckets[best].token_count))
            best = b;
    }
    return best;
}

static void test_metadata(void) {
    gdp_cache_t cache = make_cache();
    gdp_plan_t plan = make_plan(0);
    claim(plan, cache, 3); /* slots 0, 1, 2 busy: two decode, one continues its prefill */

    const int32_t S = 2, dec[2] = {1, 0};
    const gdp_prefill_request pre[3] = {
        {.slot = GDP_SLOT_AUTO, .n_tokens = 130, .flags = GDP_PREFILL_NEW | GDP_PREFILL_SAVE, .save_snapshot = 2,
         .save_offset = 64},
        {.slot = 2, .n_tokens = 7},
        {.slot = 6, .n_tokens = 64, .flags = GDP_PREFILL_NEW | GDP_PREFILL_SAVE, .save_snapshot = 0,
         .save_offset = 64},
    };
    gdp_step_desc d = {.decode_count = 2, .decode_tokens = S, .decode_slots = dec, .prefill_count = 3,
                       .prefill = pre, .bucket = GDP_BUCKET_AUTO};
    const gdp_step_metadata *m = NULL;
    CHECK_OK(gdp_plan_bcast(plan, NULL, 0, &d));
    const gdp_step_desc *got = NULL;
    CHECK_OK(gdp_plan_get_step(plan, &got));
    CHECK(got && got->decode_count == 2 && got->decode_tokens == S && got->prefill_count == 3 &&
              got->prefill[0].n_tokens == 130 && got->prefill[2].slot == 6 && got->decode_slots[1] == 0,
          "the step held by the plan differs from the one sent");
    CHECK_OK(gdp_plan_build(plan, cache, NULL, &m));
    if (m == NULL)
        return;
    const int64_t tokens = 130 + 7 + 64;
    const int32_t eb = expected_bucket(2, S, 3, tokens);
    CHECK(m->bucket == eb, "bucket %d chosen, the smallest that fits is %d", m->bucket, eb);
    const gdp_step_bucket *b = &k_buckets[eb];
    const int32_t pd = b->decode_count, pp = b->prefill_count, rows = b->token_count - pd * S;
    CHECK(m->padded_decode_count == pd && m->padded_prefill_count == pp && m->padded_token_count == b->token_count,
          "padded sizes (%d, %d, %d) are not bucket %d's", m->padded_decode_count, m->padded_prefill_count,
          m->padded_token_count, eb);
    CHECK(m->prefill_token_offset == pd * S && m->prefill_rows == rows && m->prefill_tokens == tokens,
          "prefill block at %d with %d rows and %d tokens; expected %d, %d, %lld", m->prefill_token_offset,
          m->prefill_rows, m->prefill_tokens, pd * S, rows, (long long)tokens);
    CHECK(m->decode_count == 2 && m->decode_tokens == S && m->prefill_count == 3 && m->num_householder == M_COPIES,
          "real counts wrong");
    /* slots: real then -1; the new AUTO request took the lowest free slot (3) */
    for (int32_t i = 0; i < pd; i++)
        CHECK(m->host.decode_slots[i] == (i < 2 ? dec[i] : -1), "decode_slots[%d] = %d", i, m->host.decode_slots[i]);
    CHECK(m->step->prefill[0].slot == 3, "GDP_SLOT_AUTO resolved to %d; slots 0-2 are busy so 3 is the lowest free",
          m->step->prefill[0].slot);
    for (int32_t i = 0; i < pp; i++)
        CHECK(m->host.prefill_slots[i] == (i < 3 ? m->step->prefill[i].slot : -1), "prefill_slots[%d] = %d", i,
              m->host.prefill_slots[i]);
    /* cu_seqlens: prefix sums, padding repeats the last value */
    int32_t cu[16] = {0};
    for (int32_t i = 0; i < pp; i++)
        cu[i + 1] = cu[i] + (i < 3 ? pre[i].n_tokens : 0);
    CHECK(!memcmp(m->host.cu_seqlens, cu, sizeof(int32_t) * (size_t)(pp + 1)), "cu_seqlens differ from the prefix sums");
    /* descriptors: exactly what the descriptor builder gives for these cu_seqlens */
    int64_t nc = 0, ncdp = 0;
    CHECK_OK(gdp_max_chunk_counts(rows, pp, M_COPIES, &nc, &ncdp));
    CHECK(m->num_chunks == nc && m->num_chunks_dp == ncdp, "chunk counts (%lld, %lld), expected (%lld, %lld)",
          (long long)m->num_chunks, (long long)m->num_chunks_dp, (long long)nc, (long long)ncdp);
    int32_t *ci = calloc((size_t)(2 * nc), 4), *cidp = calloc((size_t)(2 * ncdp), 4), off[16];
    int64_t nc2, ncdp2;
    CHECK_OK(gdp_build_chunk_descriptors(cu, pp, M_COPIES, rows, ci, cidp, off, &nc2, &ncdp2));
    CHECK(!memcmp(m->host.chunk_indices, ci, sizeof(int32_t) * (size_t)(2 * nc)), "chunk_indices differ");
    CHECK(!memcmp(m->host.chunk_indices_dp, cidp, sizeof(int32_t) * (size_t)(2 * ncdp)), "chunk_indices_dp differ");
    CHECK(!memcmp(m->host.chunk_offsets, off, sizeof(int32_t) * (size_t)(pp + 1)), "chunk_offsets differ");
    /* per-token conv metadata */
    int64_t bad = 0;
    for (int32_t t = 0; t < rows; t++) {
        int32_t req = -1;
        for (int32_t i = 0; i < 3; i++)
            if (t >= cu[i] && t < cu[i + 1])
                req = i;
        bad += m->host.seq_idx[t] != req;
        bad += m->host.conv_seq_idx[t] != (req < 0 ? 0 : req);
        bad += m->host.conv_seq_start[t] != (req < 0 ? 0 : cu[req]);
    }
    CHECK(bad == 0, "%lld per-token metadata entries wrong", (long long)bad);
    /* snapshot saves: request 0 inside its slice (a chunk-state row), request 2 at its end */
    CHECK(m->save_count == 2 && m->chunk_state_saves == 1, "saves %d (chunk-state %d), expected 2 (1)", m->save_count,
          m->chunk_state_saves);
    CHECK(m->host.save_snapshot[0] == 2 && m->host.save_chunk_row[0] == off[0] + 64 / 64 &&
              m->host.save_cu_seqlens[1] == 64,
          "request 0's save: snapshot %d row %d offset %d", m->host.save_snapshot[0], m->host.save_chunk_row[0],
          m->host.save_cu_seqlens[1]);
    CHECK(m->host.save_snapshot[1] == -1 && m->host.save_chunk_row[1] == -1, "request 1 saves nothing");
    CHECK(m->host.save_snapshot[2] == 0 && m->host.save_chunk_row[2] == -1 && m->host.save_offset[2] == 64,
          "request 2's save at its end must read the final state (row -1)");
    /* one buffer holds every array; the CPU backend's device arrays are the host ones */
    const char *lo = m->host_buffer, *hi = lo + m->buffer_bytes;
    const int32_t *arrays[] = {m->host.decode_slots, m->host.prefill_slots, m->host.cu_seqlens, m->host.chunk_indices,
                               m->host.chunk_indices_dp, m->host.chunk_offsets, m->host.seq_idx, m->host.save_cu_seqlens};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        CHECK((const char *)arrays[i] >= lo && (const char *)arrays[i] < hi, "array %zu outside the metadata buffer", i);
    CHECK(m->device.cu_seqlens == m->host.cu_seqlens, "CPU backend: device arrays must be the host arrays");
    free(ci), free(cidp);
    printf("metadata: bucket %d of %d (smallest fit), %d+%d padded requests, %d rows, %lld/%lld descriptor rows, "
           "2 snapshot saves: all as defined\n",
           m->bucket, N_BUCKETS, pd, pp, m->padded_token_count, (long long)nc, (long long)ncdp);
    CHECK_OK(gdp_cache_apply_step(cache, m));
    CHECK_OK(gdp_plan_free(plan));
    CHECK_OK(gdp_cache_free(cache));
}

/* Every refused step names its numbers and modifies nothing. */
static void test_refused_steps(void) {
    gdp_cache_t cache = make_cache();
    gdp_plan_t plan = make_plan(0);
    claim(plan, cache, 5); /* slots 0-4 busy, 3 free */
    /* a good step to hold metadata whose bytes must survive the refusals */
    const int32_t dec0[1] = {4};
    gdp_step_desc good = {.decode_count = 1, .decode_tokens = 1, .decode_slots = dec0, .bucket = GDP_BUCKET_AUTO};
    const gdp_step_metadata *m = NULL;
    CHECK_OK(gdp_plan_bcast(plan, NULL, 0, &good));
    CHECK_OK(gdp_plan_build(plan, cache, NULL, &m));
    const size_t bytes = m ? m->buffer_bytes : 0;
    unsigned char *saved = malloc(bytes ? bytes : 1);
    if (m)
        memcpy(saved, m->host_buffer, bytes);

    gdp_prefill_request four_new[4], one;
    for (int i = 0; i < 4; i++)
        four_new[i] = (gdp_prefill_request){.slot = GDP_SLOT_AUTO, .n_tokens = 2, .flags = GDP_PREFILL_NEW};
    const int32_t dec_dup[2] = {1, 1}, dec_free[1] = {6}, rel_free[1] = {7}, dec3[3] = {0, 1, 2};
    gdp_prefill_request big = {.slot = 3, .n_tokens = 510};
    struct { const char *what; gdp_step_desc d; gdp_prefill_request p; const char *needle[3]; } cases[] = {
        {"slot exhaustion", {.prefill_count = 4, .prefill = four_new, .bucket = GDP_BUCKET_AUTO}, {0},
         {"4 new requests", "only 3 of the cache's 8 slots", NULL}},
        {"bucket too small", {.decode_count = 3, .decode_tokens = 1, .decode_slots = dec3, .bucket = 0}, {0},
         {"bucket 0", "3 decode requests > the bucket's 2", NULL}},
        {"no bucket fits", {.prefill_count = 1, .prefill = &big, .decode_count = 1, .decode_tokens = 1,
                            .decode_slots = dec0, .bucket = GDP_BUCKET_AUTO}, {0},
         {"fits none", "510 prefill tokens", NULL}},
        {"bucket tokens", {.prefill_count = 1, .prefill = &one, .bucket = 2}, {.slot = 3, .n_tokens = 300},
         {"bucket 2", "300 prefill tokens", "256"}},
        {"duplicate decode slot", {.decode_count = 2, .decode_tokens = 1, .decode_slots = dec_dup,
                                   .bucket = GDP_BUCKET_AUTO}, {0}, {"slot 1", "named earlier", NULL}},
        {"decode of a free slot", {.decode_count = 1, .decode_tokens = 1, .decode_slots = dec_free,
                                   .bucket = GDP_BUCKET_AUTO}, {0}, {"slot 6", "not in use", NULL}},
        {"release of a free slot", {.release_count = 1, .release_slots = rel_free, .bucket = GDP_BUCKET_AUTO}, {0},
         {"slot 7", "not in use", NULL}},
        {"new slot in use", {.prefill_count = 1, .prefill = &one, .bucket = GDP_BUCKET_AUTO},
         {.slot = 2, .n_tokens = 3, .flags = GDP_PREFILL_NEW}, {"slot 2", "in use", NULL}},
        {"slot out of range", {.prefill_count = 1, .prefill = &one, .bucket = GDP_BUCKET_AUTO},
         {.slot = 8, .n_tokens = 3}, {"slot 8", "[0, 8)", NULL}},
        {"empty slice", {.prefill_count = 1, .prefill = &one, .bucket = GDP_BUCKET_AUTO}, {.slot = 1, .n_tokens = 0},
         {"n_tokens = 0", NULL, NULL}},
        {"save offset", {.prefill_count = 1, .prefill = &one, .bucket = GDP_BUCKET_AUTO},
         {.slot = 1, .n_tokens = 100, .flags = GDP_PREFILL_SAVE, .save_snapshot = 0, .save_offset = 70},
         {"offset 70", "100 tokens", "multiple of 64"}},
        {"snapshot out of range", {.prefill_count = 1, .prefill = &one, .bucket = GDP_BUCKET_AUTO},
         {.slot = 1, .n_tokens = 64, .flags = GDP_PREFILL_SAVE, .save_snapshot = 4, .save_offset = 64},
         {"snapshot 4", "[0, 4)", NULL}},
        {"restore without new", {.prefill_count = 1, .prefill = &one, .bucket = GDP_BUCKET_AUTO},
         {.slot = 1, .n_tokens = 3, .flags = GDP_PREFILL_RESTORE}, {"without GDP_PREFILL_NEW", NULL, NULL}},
        {"auto without new", {.prefill_count = 1, .prefill = &one, .bucket = GDP_BUCKET_AUTO},
         {.slot = GDP_SLOT_AUTO, .n_tokens = 3}, {"GDP_SLOT_AUTO", NULL, NULL}},
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n_cases; i++) {
        one = cases[i].p;
        int32_t free_before = -1, free_after = -2;
        CHECK_OK(gdp_cache_free_slot_count(cache, &free_before));
        CHECK_OK(gdp_plan_bcast(plan, NULL, 0, &cases[i].d));
        const gdp_step_metadata *bad = NULL;
        CHECK_STATUS(gdp_plan_build(plan, cache, NULL, &bad), GDP_STATUS_INVALID_ARGUMENT);
        CHECK(bad == NULL, "%s: meta returned on failure", cases[i].what);
        for (int k = 0; k < 3; k++)
            if (cases[i].needle[k])
                CHECK(contains(gdp_last_error(), cases[i].needle[k]), "%s: message '%s' lacks '%s'", cases[i].what,
                      gdp_last_error(), cases[i].needle[k]);
        CHECK_OK(gdp_cache_free_slot_count(cache, &free_after));
        CHECK(free_after == free_before, "%s: free slots %d -> %d", cases[i].what, free_before, free_after);
        if (m)
            CHECK(!memcmp(saved, m->host_buffer, bytes), "%s: the previous metadata buffer was modified",
                  cases[i].what);
    }
    printf("refused steps: %d cases (slot exhaustion, unfitting buckets, bad slots/snapshots/offsets) refused "
           "naming their numbers, nothing modified\n",
           n_cases);

    /* A desc that does not fit the frame is refused by gdp_plan_bcast (the root). */
    int32_t many[9] = {0};
    gdp_step_desc over = {.decode_count = 9, .decode_tokens = 1, .decode_slots = many, .bucket = GDP_BUCKET_AUTO};
    CHECK_STATUS(gdp_plan_bcast(plan, NULL, 0, &over), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(contains(gdp_last_error(), "decode_count is 9") && contains(gdp_last_error(), "[0, 8]"), "message: %s",
          gdp_last_error());
    gdp_step_desc toolong = {.decode_count = 1, .decode_tokens = 4, .decode_slots = many, .bucket = GDP_BUCKET_AUTO};
    CHECK_STATUS(gdp_plan_bcast(plan, NULL, 0, &toolong), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(contains(gdp_last_error(), "decode_tokens is 4"), "message: %s", gdp_last_error());
    free(saved);
    CHECK_OK(gdp_plan_free(plan));
    CHECK_OK(gdp_cache_free(cache));
}

/* ---- several ranks -------------------------------------------------------------------------- */

static const char *name_of(gdp_status_t s) { return gdp_status_string(s); }

static void test_bcast(gdp_comm_t comm) {
    gdp_cache_t cache = make_cache();
    gdp_plan_t plan = make_plan(1);
    for (int32_t root = 0; root < g_size; root += (g_size > 1 ? g_size - 1 : 1)) {
        const gdp_prefill_request pre[2] = {
            {.slot = GDP_SLOT_AUTO, .n_tokens = 70 + root, .flags = GDP_PREFILL_NEW},
            {.slot = GDP_SLOT_AUTO, .n_tokens = 5, .flags = GDP_PREFILL_NEW | GDP_PREFILL_SAVE, .save_snapshot = 1,
             .save_offset = 5}};
        gdp_step_desc d = {.prefill_count = 2, .prefill = pre, .bucket = GDP_BUCKET_AUTO};
        /* only the root's desc counts: the others pass NULL */
        CHECK_OK(gdp_plan_bcast(plan, comm, root, g_rank == root ? &d : NULL));
        const gdp_step_desc *got = NULL;
        CHECK_OK(gdp_plan_get_step(plan, &got));
        CHECK(got && got->prefill_count == 2 && got->prefill[0].n_tokens == 70 + root &&
                  got->prefill[1].flags == pre[1].flags && got->prefill[1].save_snapshot == 1,
              "rank %d did not receive root %d's step", g_rank, root);
        const gdp_step_metadata *m = NULL;
        CHECK_OK(gdp_plan_build(plan, cache, comm, &m)); /* debug_check: hash all-reduce inside */
        if (m) {
            CHECK_OK(gdp_plan_check_consistent(m, comm));
            CHECK_OK(gdp_cache_apply_step(cache, m));
        }
        /* finish both requests so the next round starts from the same free slots */
        const int32_t rel[2] = {m ? m->step->prefill[0].slot : 0, m ? m->step->prefill[1].slot : 1};
        gdp_step_desc r = {.release_count = 2, .release_slots = rel, .bucket = GDP_BUCKET_AUTO};
        CHECK_OK(gdp_plan_bcast(plan, comm, root, &r));
        CHECK_OK(gdp_plan_build(plan, cache, comm, &m));
        if (m)
            CHECK_OK(gdp_cache_apply_step(cache, m));
    }
    /* The root's invalid step fails on every rank; the others carry its message. */
    int32_t many[9] = {0};
    gdp_step_desc over = {.decode_count = 9, .decode_tokens = 1, .decode_slots = many, .bucket = GDP_BUCKET_AUTO};
    gdp_status_t st = gdp_plan_bcast(plan, comm, 0, g_rank == 0 ? &over : NULL);
    const gdp_status_t want = g_rank == 0 ? GDP_STATUS_INVALID_ARGUMENT : GDP_STATUS_REMOTE_ERROR;
    CHECK(st == want, "rank %d: bcast of an invalid step returned %s, expected %s", g_rank, name_of(st), name_of(want));
    CHECK(contains(gdp_last_error(), "decode_count is 9"), "rank %d: message '%s' lacks the root's numbers", g_rank,
          gdp_last_error());
    CHECK_OK(gdp_plan_free(plan));
    CHECK_OK(gdp_cache_free(cache));
    if (g_rank == 0)
        printf("mpi bcast: roots 0 and %d reach every rank, metadata hashes agree; an invalid root step fails on every "
               "rank with its message\n",
               g_size - 1);
}

static void test_errors_everywhere(gdp_comm_t comm) {
    gdp_cache_t cache = make_cache();
    gdp_plan_t plan = make_plan(1);
    gdp_prefill_request nine[8];
    for (int i = 0; i < 8; i++)
        nine[i] = (gdp_prefill_request){.slot = GDP_SLOT_AUTO, .n_tokens = 1, .flags = GDP_PREFILL_NEW};
    /* claim 6 slots everywhere */
    gdp_step_desc six = {.prefill_count = 6, .prefill = nine, .bucket = GDP_BUCKET_AUTO};
    const gdp_step_metadata *m = NULL;
    CHECK_OK(gdp_plan_bcast(plan, comm, 0, &six));
    CHECK_OK(gdp_plan_build(plan, cache, comm, &m));
    if (m)
        CHECK_OK(gdp_cache_apply_step(cache, m));
    /* 3 more: exhaustion on every rank, numbers named */
    gdp_step_desc three = {.prefill_count = 3, .prefill = nine, .bucket = GDP_BUCKET_AUTO};
    CHECK_OK(gdp_plan_bcast(plan, comm, 0, &three));
    CHECK_STATUS(gdp_plan_build(plan, cache, comm, &m), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(contains(gdp_last_error(), "3 new requests") && contains(gdp_last_error(), "only 2 of the cache's 8"),
          "rank %d: exhaustion message '%s'", g_rank, gdp_last_error());
    /* a step that does not fit its bucket, on every rank */
    gdp_prefill_request longp = {.slot = 0, .n_tokens = 65};
    gdp_step_desc unfit = {.prefill_count = 1, .prefill = &longp, .bucket = 0};
    CHECK_OK(gdp_plan_bcast(plan, comm, 0, &unfit));
    CHECK_STATUS(gdp_plan_build(plan, cache, comm, &m), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(contains(gdp_last_error(), "bucket 0") && contains(gdp_last_error(), "65 prefill tokens"),
          "rank %d: bucket message '%s'", g_rank, gdp_last_error());
    int32_t n_free = -1;
    CHECK_OK(gdp_cache_free_slot_count(cache, &n_free));
    CHECK(n_free == 2, "rank %d: refused steps changed the free slots to %d", g_rank, n_free);

    /* Divergence: the last rank's cache claims one more slot behind the others' back. The
     * next new request then lands on different slots: the hash check fails everywhere. */
    if (g_rank == g_size - 1) {
        gdp_plan_t solo = make_plan(0);
        gdp_step_desc one = {.prefill_count = 1, .prefill = nine, .bucket = GDP_BUCKET_AUTO};
        test_step_local(solo, cache, &one);
        CHECK_OK(gdp_plan_free(solo));
    }
    gdp_step_desc one = {.prefill_count = 1, .prefill = nine, .bucket = GDP_BUCKET_AUTO};
    CHECK_OK(gdp_plan_bcast(plan, comm, 0, &one));
    gdp_status_t st = gdp_plan_build(plan, cache, comm, &m);
    if (g_size > 1) {
        CHECK(st == GDP_STATUS_INVALID_USAGE, "rank %d: diverged metadata: build returned %s, expected invalid usage",
              g_rank, name_of(st));
        CHECK(contains(gdp_last_error(), "step metadata"), "rank %d: message '%s'", g_rank, gdp_last_error());
        /* Now 2 new requests: exhaustion on the last rank only (1 free) -> every rank fails. */
        gdp_step_desc two = {.prefill_count = 2, .prefill = nine, .bucket = GDP_BUCKET_AUTO};
        CHECK_OK(gdp_plan_bcast(plan, comm, 0, &two));
        st = gdp_plan_build(plan, cache, comm, &m);
        const gdp_status_t want = g_rank == g_size - 1 ? GDP_STATUS_INVALID_ARGUMENT : GDP_STATUS_REMOTE_ERROR;
        CHECK(st == want, "rank %d: one rank's exhaustion returned %s here, expected %s", g_rank, name_of(st),
              name_of(want));
        CHECK(contains(gdp_last_error(), "slot exhaustion"), "rank %d: message '%s'", g_rank, gdp_last_error());
    } else {
        CHECK(st == GDP_STATUS_SUCCESS, "one rank: build returned %s", name_of(st));
    }
    CHECK_OK(gdp_plan_free(plan));
    CHECK_OK(gdp_cache_free(cache));
    if (g_rank == 0)
        printf("mpi errors: slot exhaustion and an unfitting bucket fail on every rank naming the numbers; a diverged "
               "cache fails the hash check on every rank; one rank's failure fails every rank\n");
}

int main(int argc, char **argv) {
    const bool mpi = argc > 1 && !strcmp(argv[1], "--mpi");
    CHECK_OK(gdp_ctx_init(&g_ctx, GDP_BACKEND_CPU, 0));
    if (!mpi) {
        test_config_errors();
        test_metadata();
        test_refused_steps();
        CHECK_OK(gdp_ctx_free(g_ctx));
        return test_finish("test_plan");
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    gdp_comm_t comm = NULL;
    GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&comm, GDP_COMM_MPI, NULL, GDP_COMM_HOST_BUFFERS));
    test_bcast(comm);
    test_errors_everywhere(comm);
    CHECK_OK(gdp_comm_free(comm));
    CHECK_OK(gdp_ctx_free(g_ctx));
    int failures = 0;
    MPI_Allreduce(&g_test_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("# failures over %d ranks : %d %s\n", g_size, failures, failures ? "FAILED" : "OK");
    if (g_rank == 0 || g_test_failures)
        test_finish("test_plan_mpi");
    MPI_Finalize();
    return failures ? 1 : 0;
}
