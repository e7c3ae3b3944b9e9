/*
 * descriptors.c: chunk descriptors of a prefill step (gdp-math.md 4.3, 4.4):
 * gdp_max_chunk_counts and gdp_build_chunk_descriptors, on the host. Everything is
 * validated and counted before the first write, so a failing call writes nothing.
 */
#include <math.h>
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

/* The state sweep's value-column block for VP padded value columns, heads x seqs (sequence, head)
 * pairs on sms multiprocessors (the staged chain's chunk_state_kernel, and the auto choice's estimate
 * of it). The sweep is sequential over a sequence's chunks, so its parallelism is its grid, (VP / VB)
 * x H x N blocks; a few long sequences (1 x 16384 with H = 16, V = 128: 32 blocks of 64 columns) leave
 * most of the device idle. The columns of the state evolve independently (state.cuh), so narrower
 * blocks give more, lighter blocks with bitwise the same results: each still walks the whole chain,
 * but a step does 64 / VB times less tensor-core work. The widest block whose grid still fills three
 * quarters of the SMs is chosen (fewest re-reads of w and K); when even 16 columns do not, 16.
 * Measured on the H200 (kernels/NOTES-chunk.md): 8 x 2048 (256 blocks at 64) 64 best, 1.00 ms vs 1.12 (32) and 1.36 (16);
 * 1 x 16384 (32 blocks at 64) 16 best, 1.49 ms vs 1.72 and 1.98; H 32 V 64 4 x 2048 (128 blocks at 64,
 * 97 % of the SMs) 64 best, 1.07 ms vs 1.12 (32): a nearly full grid of wide blocks beats a fuller one. */
int gdp_chunk_state_vb(int vp, int64_t heads, int64_t seqs, int sms) {
    const int64_t items = heads * seqs, enough = (3 * (int64_t)sms + 3) / 4;
    if ((int64_t)(vp / 64) * items >= enough)
        return 64;
    if ((int64_t)(vp / 32) * items >= enough)
        return 32;
    return 16;
}

/* The op's own choice among the staged chain, the one-pass Hopper kernel and its exact segment split
 * (GDP_CHUNK_PATH unset or auto, on a device and shape the Hopper kernel takes), from the work's
 * shape alone: estimates in microseconds from the H200's rates (132 SMs), each fitted to measured
 * `gdp-bench ops --op prefill` rows (GDP_CHUNK_PATH=hopper|staged, GDP_CHUNK_SEGMENT=off|auto;
 * kernels/NOTES-chunk.md, twenty-fifth and twenty-ninth sessions); test_descriptors checks the choice
 * on every measured row.
 * - Hopper, unsplit: one block a (sequence, head) walking its chunks in order: waves of blocks x the
 *   longest sequence's chunks x a chunk's time (433 us for 64 chunks at K = V = 128: 6.8 us; 551 us
 *   for 96 at V = 64: 5.8; 374 us for 64 at K = 64, V = 128: 5.84).
 * - Hopper, split (K = V = 128 only: measured there): split_pass1_chunks (below) chunk times of 6.8 us
 *   for its items' waves, plus SPLIT_FIXED_US (the plan, the fix-up's launch, the outputs' correction
 *   over every token past first segments) and SPLIT_US_PER_FIXUP_STEP a fix-up step (one a segment
 *   past the longest sequence's first, in order): the correction as the thirty-ninth session measured
 *   it (H100: 81-87 us on 1 x 16384), the fix-up step as the fifty-third measured it with its product
 *   on the tensor cores (H100: 32 us for 1 x 16384's 8 steps, 27 for the mixed batch's 3 in two waves,
 *   2.5 us a step and about 12 fixed; 6.3 a step before, when the estimate put 1 x 16384 at 902 us,
 *   S = 56, and the mixed batch at 762, S = 48: 956 and 749 measured then). The lower step moved no
 *   choice of test_descriptors' rows (the pass's rounding into waves decides S).
 * - Staged: the parallel stages (cumsums, WY, outputs) 0.0656 us a (chunk, head) pair, plus the state
 *   sweep, a chain per (sequence, head, VB columns): the longest chain at a lone block's step or all
 *   blocks' steps over the SMs at a shared SM's step, whichever is longer (VB = 16: 1.06 us a step,
 *   from 1 x 16384's 542 us sweep; VB = 64: 2.40 us alone, from the mixed batch, 1.99 us shared, from
 *   8 x 2048; VB = 32 between, 1.6 and 1.45, not measured). At V = 64 (one row measured, 861 us for
 *   12,288 pairs) 0.070 us a pair, a lower bound.
 * K other than 128 and 64, an unknown longest sequence (max_seqlen 0), or no work: staged, which never
 * loses by much.
 * The forty-eighth session took work off the Hopper kernel's aux chain and its chunk times fell 10-14 %
 * (H100: 6.0 us at K = V = 128, M = 2; 4.9 at V = 64; 5.1 at K = 64); the rates below are the fit
 * before that, not refitted: every Hopper estimate falls together, so the choice between the paths
 * can only move toward the Hopper kernel, and the split's segment length was not measured again. */
#define HOPPER_US_PER_CHUNK_V128 6.8
#define HOPPER_US_PER_CHUNK_V64 5.8
#define HOPPER_US_PER_CHUNK_K64 5.84
#define SPLIT_FIXED_US 90.0
#define SPLIT_US_PER_FIXUP_STEP 2.5
#define STAGED_PARALLEL_US_PER_CHUNK_HEAD 0.0656
#define STAGED_US_PER_CHUNK_HEAD_V64 0.070
/* The split's pass 1 in chunk times for segments of S expanded chunks (hopper_split.cuh: a sequence's
 * first segment 2 S with no F item, the others S with an F item each), from the work's shape alone:
 * C expanded chunks, the longest sequence L of them. The batch is taken as copies of the longest
 * (as many as C holds) and one sequence of the rest: the most F work C chunks can hold. Its items run
 * in waves over the SMs, each about S chunks (a first segment's 2 S as two): C plus the chunks past
 * first segments, over the SMs, rounded up to whole waves of S, and never under the longest first
 * segment. The rounding is what the choice of S is about (thirty-ninth session, H100, split-runs us):
 * 1 x 16384 at M = 2, H = 16 ran 848 at uniform segments of 64, 836-867 at S = 24-64 but 969 at
 * S = 48 (3 waves); the mixed batch 836 uniform, 678 at S = 48 and 813 at S = 40 (3 waves). */
static double split_pass1_chunks(int64_t S, int64_t C, int64_t L, int64_t H, int sms) {
    const int64_t copies = C / L, rest = C - copies * L;
    const int64_t past = copies * (L > 2 * S ? L - 2 * S : 0) + (rest > 2 * S ? rest - 2 * S : 0);
    const double waves = ceil((double)H * (double)(C + past) / ((double)S * sms));
    const double first = (double)(L < 2 * S ? L : 2 * S);
    return waves * S > first ? waves * S : first;
}
/* The split's estimate in microseconds at segments of S: pass 1, the fixed part and the fix-up's steps
 * (one a segment past the longest sequence's first). */
static double split_estimate_us(int64_t S, int64_t C, int64_t L, int64_t H, int sms) {
    const int64_t steps = L > 2 * S ? (L - 2 * S + S - 1) / S : 0;
    return split_pass1_chunks(S, C, L, H, sms) * HOPPER_US_PER_CHUNK_V128 + SPLIT_FIXED_US +
           SPLIT_US_PER_FIXUP_STEP * (double)steps;
}

/* The Hopper split's segment length when the op chooses it: the S of least split_estimate_us, in steps
 * of 8 from 16 (a segment past a sequence's first costs an F run, a fix-up step and its correction:
 * short segments spend more on the split than they save) up to about two waves' worth (2 C H / SMs;
 * at most 512 candidates), while the longest sequence still has a second segment. */
int64_t gdp_chunk_split_segment(int64_t num_chunks_dp, int64_t H, int64_t longest, int sms) {
    if (sms < 1)
        sms = 1;
    const int64_t want = (num_chunks_dp * H + sms - 1) / sms, top = 2 * want + 8;
    const int64_t step = top / 512 > 8 ? (top / 512 + 7) / 8 * 8 : 8;
    int64_t best = 16;
    double best_us = 0.0;
    for (int64_t S = 16; 2 * S < longest && S <= top; S += step) {
        const double us = split_estimate_us(S, num_chunks_dp, longest, H, sms);
        if (S == 16 || us < best_us) {
            best = S;
            best_us = us;
        }
    }
    return best;
}

/* the state sweep's step at VB = 64, 32, 16 columns: a lone block's, and an SM shared by blocks */
static const double STAGED_LONE_STEP_US[3] = {2.40, 1.6, 1.06};
static const double STAGED_SHARED_STEP_US[3] = {1.99, 1.45, 1.06};

static double staged_estimate_us(int64_t num_chunks_dp, int64_t N, int64_t H, int64_t V, int64_t longest, int sms) {
    if (V <= 64)
        return (double)num_chunks_dp * (double)H * STAGED_US_PER_CHUNK_HEAD_V64;
    const int vb = gdp_chunk_state_vb((int)V, H, N, sms), w = vb == 64 ? 0 : vb == 32 ? 1 : 2;
    const double chain = (double)longest * STAGED_LONE_STEP_US[w];
    const double spread = (double)num_chunks_dp * (double)H * (double)(V / vb) / sms * STAGED_SHARED_STEP_US[w];
    return (double)num_chunks_dp * (double)H * STAGED_PARALLEL_US_PER_CHUNK_HEAD + (chain > spread ? chain : spread);
}

gdp_chunk_auto gdp_chunk_auto_choose(int64_t num_chunks_dp, int64_t N, int64_t H, int32_t M, int64_t K, int64_t V,
                                     int64_t max_seqlen, int sms) {
    gdp_chunk_auto c = {GDP_CHUNK_AUTO_STAGED, 0, 0.0, 0.0, 0.0};
    if ((K != 128 && !(K == 64 && V == 128)) || max_seqlen <= 0 || N < 1 || H < 1 || M < 1 || sms < 1 ||
        num_chunks_dp < 1)
        return c;
    const int64_t longest = (max_seqlen * M + CHUNK - 1) / CHUNK; /* the longest sequence's expanded chunks */
    const double rate = K == 64 ? HOPPER_US_PER_CHUNK_K64 : V <= 64 ? HOPPER_US_PER_CHUNK_V64 : HOPPER_US_PER_CHUNK_V128;
    c.staged_us = staged_estimate_us(num_chunks_dp, N, H, V, longest, sms);
    c.hopper_us = (double)((N * H + sms - 1) / sms) * (double)longest * rate;
    if (K == 128 && V == 128) {
        const int64_t seg = gdp_chunk_split_segment(num_chunks_dp, H, longest, sms);
        if (longest > 2 * seg) { /* a second segment */
            c.seg_chunks = (int)seg;
            c.split_us = split_estimate_us(seg, num_chunks_dp, longest, H, sms);
        }
    }
    const bool split_best = c.seg_chunks > 0 && c.split_us < c.hopper_us && c.split_us < c.staged_us;
    if (split_best)
        c.path = GDP_CHUNK_AUTO_HOPPER_SPLIT;
    else if (c.hopper_us < c.staged_us)
        c.path = GDP_CHUNK_AUTO_HOPPER;
    return c;
}
