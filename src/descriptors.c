/*
 * descriptors.c: chunk descriptors of a prefill step (gdp-math.md 4.3, 4.4):
 * gdp_max_chunk_counts and gdp_build_chunk_descriptors, on the host. Everything is
 * validated and counted before the first write, so a failing call writes nothing.
 */
#include <string.h>

#include "internal.h"

#define CHUNK GDP_CHUNK_SIZE

gdp_status_t gdp_max_chunk_counts(int64_t max_tokens, int64_t max_requests, int32_t num_householder,
                                  int64_t *max_chunks, int64_t *max_chunks_dp) {
    static const char *op = "gdp_max_chunk_counts";
    if (max_chunks == NULL || max_chunks_dp == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: max_chunks and max_chunks_dp must not be NULL", op);
    if (max_tokens < 0 || max_requests < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: max_tokens %lld and max_requests %lld must be >= 0", op,
                 (long long)max_tokens, (long long)max_requests);
    if (num_householder < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: num_householder is %d, must be >= 1", op, num_householder);
    /* Descriptors are int32 and so is every expanded token index: stay inside it. */
    if (max_requests > INT32_MAX || max_tokens > INT32_MAX / num_householder)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: max_tokens %lld x num_householder %d (or max_requests %lld) overflows int32; split the step",
                 op, (long long)max_tokens, num_householder, (long long)max_requests);
    *max_chunks = max_tokens / CHUNK + max_requests;
    *max_chunks_dp = max_tokens * num_householder / CHUNK + max_requests;
    return GDP_STATUS_SUCCESS;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

gdp_status_t gdp_build_chunk_descriptors(const int32_t *cu_seqlens, int32_t prefill_count,
                                         int32_t num_householder, int64_t padded_token_count,
                                         int32_t *chunk_indices, int32_t *chunk_indices_dp,
                                         int32_t *chunk_offsets, int64_t *num_chunks, int64_t *num_chunks_dp) {
    static const char *op = "gdp_build_chunk_descriptors";
    if (cu_seqlens == NULL || chunk_indices == NULL || chunk_indices_dp == NULL || chunk_offsets == NULL ||
        num_chunks == NULL || num_chunks_dp == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: cu_seqlens, chunk_indices, chunk_indices_dp, chunk_offsets, num_chunks and num_chunks_dp "
                 "must all be non-NULL",
                 op);
    if (prefill_count < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: prefill_count is %d, must be >= 0", op, prefill_count);
    if (padded_token_count < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: padded_token_count is %lld, must be >= 0", op,
                 (long long)padded_token_count);
    int64_t cap, cap_dp;
    GDP_CHECK(gdp_max_chunk_counts(padded_token_count, prefill_count, num_householder, &cap, &cap_dp));

    /* Pass 1: validate and count. */
    if (cu_seqlens[0] != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: cu_seqlens[0] is %d, must be 0", op, cu_seqlens[0]);
    int64_t real = 0, real_dp = 0;
    for (int32_t i = 0; i < prefill_count; i++) {
        int64_t len = (int64_t)cu_seqlens[i + 1] - cu_seqlens[i];
        if (len < 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: sequence %d has negative length %lld (cu_seqlens[%d] = %d > cu_seqlens[%d] = %d); "
                     "cu_seqlens must be non-decreasing",
                     op, i, (long long)len, i, cu_seqlens[i], i + 1, cu_seqlens[i + 1]);
        real += ceil_div(len, CHUNK);
        real_dp += ceil_div(len * num_householder, CHUNK);
    }
    if (cu_seqlens[prefill_count] > padded_token_count)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: cu_seqlens[%d] = %d tokens exceed padded_token_count %lld; pad the step to at least %d tokens",
                 op, prefill_count, cu_seqlens[prefill_count], (long long)padded_token_count,
                 cu_seqlens[prefill_count]);
    if (real > cap)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: GDP chunk descriptor overflow: %lld chunks for %d sequences exceed the capacity %lld of "
                 "%lld padded tokens",
                 op, (long long)real, prefill_count, (long long)cap, (long long)padded_token_count);
    if (real_dp > cap_dp)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: GDP expanded descriptor overflow: %lld expanded chunks for %d sequences exceed the capacity "
                 "%lld of %lld padded tokens x M=%d",
                 op, (long long)real_dp, prefill_count, (long long)cap_dp, (long long)padded_token_count,
                 num_householder);

    /* Pass 2: write real rows in sequence order (row chunk_offsets[i] + j is (i, j)). */
    int64_t r = 0, r_dp = 0;
    chunk_offsets[0] = 0;
    for (int32_t i = 0; i < prefill_count; i++) {
        int64_t len = (int64_t)cu_seqlens[i + 1] - cu_seqlens[i];
        for (int64_t j = 0; j < ceil_div(len, CHUNK); j++, r++) {
            chunk_indices[2 * r] = i;
            chunk_indices[2 * r + 1] = (int32_t)j;
        }
        for (int64_t j = 0; j < ceil_div(len * num_householder, CHUNK); j++, r_dp++) {
            chunk_indices_dp[2 * r_dp] = i;
            chunk_indices_dp[2 * r_dp + 1] = (int32_t)j;
        }
        chunk_offsets[i + 1] = (int32_t)r;
    }
    /* Padding rows address a chunk of sequence 0 past any token: 64 * pad_chunk > padded tokens. */
    int32_t pad_chunk = (int32_t)(padded_token_count / CHUNK + 1);
    int32_t pad_chunk_dp = pad_chunk * num_householder + 1;
    for (; r < cap; r++) {
        chunk_indices[2 * r] = 0;
        chunk_indices[2 * r + 1] = pad_chunk;
    }
    for (; r_dp < cap_dp; r_dp++) {
        chunk_indices_dp[2 * r_dp] = 0;
        chunk_indices_dp[2 * r_dp + 1] = pad_chunk_dp;
    }
    *num_chunks = cap;
    *num_chunks_dp = cap_dp;
    return GDP_STATUS_SUCCESS;
}

/* The op's own choice between the staged chain and the one-pass Hopper kernel (GDP_CHUNK_PATH unset
 * or auto, on a device and shape the Hopper kernel takes), from the work's shape alone. The Hopper
 * kernel runs one block a (sequence, head), each walking its sequence's chunks one after another, so
 * its time is the waves of blocks times the longest sequence's chunks times a chunk's time; the
 * staged chain spreads every stage over all chunks, so its time follows the total chunks. Both rates
 * are the H200's (`GDP_CHUNK_PATH=hopper GDP_CHUNK_SEGMENT=off` and `GDP_CHUNK_PATH=staged
 * ./build/examples/gdp-bench ops --op prefill`; docs/performance.md): the Hopper kernel 433 us for 64
 * chunks at V = 128 (6.8 us a chunk) and 551 us for 96 at V = 64 (5.8; twenty-fifth session), the
 * staged chain 784 us for 8,192 (chunk, head) pairs at V = 128 (0.096 us each) and 861 us for 12,288
 * at V = 64 (0.070; twenty-second session); a long sequence makes the staged chain slower still (its state sweep walks
 * the chunks in order), so the staged estimate is a lower bound and the rule below favours staged.
 * The rates are K = 128 figures: at any other K (the Hopper kernel also takes 64) nothing was measured
 * and the staged chain is kept. The segment split is not chosen here: it loses to the staged chain
 * on every row measured. */
#define HOPPER_US_PER_CHUNK_V128 6.8
#define HOPPER_US_PER_CHUNK_V64 5.8
#define STAGED_US_PER_CHUNK_HEAD_V128 0.096
#define STAGED_US_PER_CHUNK_HEAD_V64 0.070

bool gdp_chunk_auto_prefers_hopper(int64_t num_chunks_dp, int64_t N, int64_t H, int32_t M, int64_t K, int64_t V,
                                   int64_t max_seqlen, int sms) {
    if (K != 128)
        return false; /* no measured rate */
    if (max_seqlen <= 0 || N < 1 || H < 1 || M < 1 || sms < 1 || num_chunks_dp < 1)
        return false; /* the longest sequence unknown: the staged chain never loses by much */
    const bool narrow = V <= 64;
    const int64_t waves = (N * H + sms - 1) / sms;
    const int64_t longest_chunks = (max_seqlen * M + CHUNK - 1) / CHUNK;
    const double hopper_us =
        (double)waves * (double)longest_chunks * (narrow ? HOPPER_US_PER_CHUNK_V64 : HOPPER_US_PER_CHUNK_V128);
    const double staged_us =
        (double)num_chunks_dp * (double)H * (narrow ? STAGED_US_PER_CHUNK_HEAD_V64 : STAGED_US_PER_CHUNK_HEAD_V128);
    return hopper_us < staged_us;
}
