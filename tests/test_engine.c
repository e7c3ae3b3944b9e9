/*
 * test_engine.c: the serving engine (include/gdp/engine.h), its model (model.h) and its
 * workloads. Three modes:
 *
 *   --units (cpu, one process, no MPI): the JSONL reader (fields, defaults, arrival order,
 *     seeded prompts; every error names the file, line and field and leaves *out alone), the
 *     synthetic generator and its spec parser, the checkpoint's model tensors, the model's
 *     embedding and LM head against a double-precision reference (and a one-row request
 *     getting the same bits as in a batch), the step buckets (every composable step has one that
 *     holds it, and few slices take few entries), engine config errors, and a TP = 1 run over a
 *     JSONL file whose results file matches the results API.
 *
 *   (default, mpi, np 4; 2 and 1 work too): one seeded checkpoint; every TP size t in
 *     {1, 2, 4} dividing the ranks runs engine variants on its groups of t ranks (groups run
 *     at once) over one synthetic workload, then every rank gets every result. Generated
 *     tokens are compared by the rule of gdp-math.md 8.1:
 *       - identical tokens where each request's math is the same and only the schedule
 *         differs: preemption on/off, drafts on/off, requests arriving over time vs at once,
 *         admission by arrival vs shortest prompt first
 *         (the recurrent op rounds its state to the cache dtype between tokens, so S tokens
 *         in one step equal S steps of one token); and the logits'
 *         top-2 margins bit for bit as well where the schedule is the same too: graphs on/off
 *         (at each TP size). Under another schedule the logits still differ in the last bits:
 *         the layers' CPU GEMM (OpenBLAS) picks its kernel by the step's row count, and the
 *         kernels sum in different orders (the test prints the largest difference);
 *       - up to the first token whose top-2 logit margin is below the logit bar (1e-4 of
 *         max |logit| on the CPU) in either run: TP 1 vs 2 vs 4, chunked vs whole prefill
 *         (and slices of 64 vs 128);
 *     and each run's report: every request finished with max_new_tokens tokens, preemption
 *     variants preempted (and resumed), draft variants proposed and accepted drafts, graph
 *     hooks replayed (and never ran with graphs off), the decode-vs-recompute self check
 *     within 1e-4. Bad input: a budget too small, a token outside the vocabulary, a whole
 *     prompt over the budget, results off the root, a check without kept logits: errors on
 *     every rank naming the values, and the engine still runs afterwards. The schedule's
 *     admission order (rank 0, one slot): first tokens by prompt length with shortest first,
 *     by arrival with FCFS or an age bound of 0.
 *
 *   --backend cuda (gpu;mpi): the same comparisons with the CUDA backend at TP = ranks
 *     (bars: logits 5e-2, exact only for graphs on/off), plus a CUDA TP = 1 and a CPU TP = 1
 *     run on rank 0 against it; the preempt variant's swaps through device memory (the
 *     default) and through pinned host memory bit for bit equal. Exits 77 on every rank
 *     without a GPU.
 * Failures are summed over the ranks, so every rank exits the same way.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gdp/checkpoint.h"
#include "gdp/comm.h"
#include "gdp/engine.h"
#include "gdp/model.h"
#include "engine_internal.h" /* the step buckets (engine_sched.c) */
#include "test_common.h"
#include "test_gpu.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h> /* defines: cudaStreamCreateWithFlags (graphs need a non-default stream) */
#endif

#define NREQ 10
#define NEW 16
#define BUDGET 256
#define VOCAB 128
#define BAR_CPU 1e-4 /* logit bar: the CPU's decode-vs-recompute bar, relative to max |logit| */
#define BAR_GPU 5e-2 /* Megatron's logit bar */

static int g_rank = 0, g_size = 1;
static bool g_cuda = false;

static void test_config(gdp_layer_config *c) {
    gdp_layer_config_default(c);
    c->hidden_size = 64, c->num_layers = 2, c->num_heads = 8, c->num_groups = 4, c->head_dim = 16;
    c->state_dim = 16, c->num_householder = 2, c->vocab_size = VOCAB;
}

static void temp_path(char *buf, size_t n, const char *what, long job) {
    snprintf(buf, n, "%s/gdp_test_engine_%ld_%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", job, what);
}

/* ======================================================================================
 * --units
 * ====================================================================================== */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* A JSONL file that must fail with `status` and a message holding every `want` string. */
static void expect_jsonl_error(const char *path, const char *text, gdp_status_t status, const char *want1,
                               const char *want2) {
    write_file(path, text);
    gdp_workload wl = {.n_requests = -7};
    CHECK_STATUS(gdp_workload_load_jsonl(&wl, path, VOCAB, 1), status);
    CHECK(strstr(gdp_last_error(), want1) != NULL && (want2 == NULL || strstr(gdp_last_error(), want2) != NULL),
          "message '%s' lacks '%s'%s%s", gdp_last_error(), want1, want2 ? " / " : "", want2 ? want2 : "");
    CHECK(wl.n_requests == -7 && wl.requests == NULL, "a failed load modified *out");
}

static void units_workload(long job) {
    char path[512];
    temp_path(path, sizeof path, "workload.jsonl", job);
    write_file(path, "# a comment, then a blank line\n\n"
                     "{\"id\": 7, \"arrival\": 0.5, \"prompt\": [1, 2, 3], \"max_new_tokens\": 4}\n"
                     "{\"prompt_len\": 40, \"max_new_tokens\": 2}\n"
                     "{\"id\": 9, \"arrival\": 0.5, \"prompt_len\": 40, \"max_new_tokens\": 1}\n"
                     "{\"id\": 3, \"arrival\": 0.25, \"prompt\": [127], \"max_new_tokens\": 5}\n");
    gdp_workload wl, wl2, wl3;
    CHECK_OK(gdp_workload_load_jsonl(&wl, path, VOCAB, 11));
    CHECK_OK(gdp_workload_load_jsonl(&wl2, path, VOCAB, 11));
    CHECK_OK(gdp_workload_load_jsonl(&wl3, path, VOCAB, 12));
    CHECK(wl.n_requests == 4, "%d requests, expected 4", wl.n_requests);
    if (wl.n_requests == 4) {
        /* sorted by arrival, ties in file order: id 1 (index default, t 0), 3 (0.25), 7, 9 (0.5) */
        const int64_t ids[4] = {1, 3, 7, 9};
        for (int i = 0; i < 4; i++)
            CHECK(wl.requests[i].id == ids[i], "request %d has id %lld, expected %lld", i,
                  (long long)wl.requests[i].id, (long long)ids[i]);
        CHECK(wl.requests[2].prompt_len == 3 && wl.requests[2].prompt[0] == 1 && wl.requests[2].prompt[2] == 3 &&
                  wl.requests[2].max_new_tokens == 4 && wl.requests[2].arrival_s == 0.5,
              "request 7 parsed wrong");
        CHECK(wl.requests[1].prompt_len == 1 && wl.requests[1].prompt[0] == 127, "request 3 parsed wrong");
        CHECK(wl.requests[0].prompt_len == 40 && wl.requests[0].arrival_s == 0, "request 1 parsed wrong");
        bool same = true, other_seed = false, other_id = false, in_vocab = true;
        for (int t = 0; t < 40; t++) {
            same &= wl.requests[0].prompt[t] == wl2.requests[0].prompt[t];
            other_seed |= wl.requests[0].prompt[t] != wl3.requests[0].prompt[t];
            other_id |= wl.requests[0].prompt[t] != wl.requests[3].prompt[t];
            in_vocab &= wl.requests[0].prompt[t] >= 0 && wl.requests[0].prompt[t] < VOCAB;
        }
        CHECK(same && other_seed && other_id && in_vocab,
              "prompts from a length: same seed same tokens %d, another seed differs %d, another id differs %d, "
              "in the vocabulary %d", same, other_seed, other_id, in_vocab);
    }
    CHECK(strstr(wl.source, "workload.jsonl") != NULL, "source '%s'", wl.source);
    gdp_workload_free(&wl), gdp_workload_free(&wl2), gdp_workload_free(&wl3);
    CHECK(wl.requests == NULL && wl.n_requests == 0, "gdp_workload_free did not zero the workload");

    expect_jsonl_error(path, "{\"prompt\": [1], \"max_new_tokens\": 2}\n{\"prompt\": [1, \"max_new_tokens\": 2}\n",
                       GDP_STATUS_INVALID_ARGUMENT, "workload.jsonl:2", "not valid JSON");
    expect_jsonl_error(path, "{\"prompt\": [1, 2]}\n", GDP_STATUS_INVALID_ARGUMENT, ":1:", "max_new_tokens");
    expect_jsonl_error(path, "\n{\"prompt\": [1], \"prompt_len\": 4, \"max_new_tokens\": 1}\n",
                       GDP_STATUS_INVALID_ARGUMENT, ":2:", "exactly one");
    expect_jsonl_error(path, "{\"max_new_tokens\": 1}\n", GDP_STATUS_INVALID_ARGUMENT, ":1:", "exactly one");
    expect_jsonl_error(path, "{\"prompt\": [5, 128], \"max_new_tokens\": 1}\n", GDP_STATUS_INVALID_ARGUMENT,
                       "prompt[1] = 128", "[0, 128)");
    expect_jsonl_error(path, "{\"prompt\": [5, 1.5], \"max_new_tokens\": 1}\n", GDP_STATUS_INVALID_ARGUMENT,
                       "prompt[1] is not an integer", ":1:");
    expect_jsonl_error(path, "{\"id\": 4, \"prompt\": [5], \"max_new_tokens\": 1}\n{\"id\": 4, \"prompt\": [6], "
                       "\"max_new_tokens\": 1}\n", GDP_STATUS_INVALID_ARGUMENT, ":2:", "id 4 is used twice");
    expect_jsonl_error(path, "{\"prompt\": [5], \"max_new_tokens\": 1, \"colour\": 1}\n",
                       GDP_STATUS_INVALID_ARGUMENT, "unknown field", "colour");
    expect_jsonl_error(path, "{\"prompt\": [5], \"max_new_tokens\": 0}\n", GDP_STATUS_INVALID_ARGUMENT,
                       "max_new_tokens", "out of range");
    expect_jsonl_error(path, "{\"prompt\": [5], \"max_new_tokens\": 1, \"arrival\": -1}\n",
                       GDP_STATUS_INVALID_ARGUMENT, "arrival", ":1:");
    expect_jsonl_error(path, "# nothing\n\n", GDP_STATUS_INVALID_ARGUMENT, "holds no request", NULL);
    remove(path);
    gdp_workload wl4 = {.n_requests = -7};
    CHECK_STATUS(gdp_workload_load_jsonl(&wl4, path, VOCAB, 1), GDP_STATUS_SYSTEM_ERROR);
    CHECK(strstr(gdp_last_error(), "cannot open") != NULL, "missing-file message '%s'", gdp_last_error());

    /* synthetic */
    gdp_synthetic_workload p;
    CHECK_OK(gdp_workload_synthetic_default(&p));
    CHECK(p.n_requests == 32 && p.rate == 0 && p.prompt_min == 16 && p.prompt_max == 300 && p.new_min == 32 &&
              p.new_max == 32,
          "default synthetic workload (%d, %g, %d-%d, %d-%d)", p.n_requests, p.rate, p.prompt_min, p.prompt_max,
          p.new_min, p.new_max);
    CHECK_OK(gdp_workload_parse_synthetic("synthetic:new=3-9,n=50,prompt=7,rate=100,seed=5", &p));
    CHECK(p.n_requests == 50 && p.new_min == 3 && p.new_max == 9 && p.prompt_min == 7 && p.prompt_max == 7 &&
              p.rate == 100 && p.seed == 5,
          "parsed spec wrong");
    const gdp_synthetic_workload keep = p;
    const char *bad[] = {"n=0", "rate=-1", "prompt=9-3", "new=x", "colour=2", "n", "repeat=2"};
    const char *want[] = {"n=0", "rate", "9-3", "new=x", "colour", "'n'", "repeat"};
    for (int i = 0; i < 7; i++) {
        CHECK_STATUS(gdp_workload_parse_synthetic(bad[i], &p), GDP_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(gdp_last_error(), want[i]) != NULL, "spec '%s': message '%s' lacks '%s'", bad[i],
              gdp_last_error(), want[i]);
        CHECK(!memcmp(&p, &keep, sizeof p), "a refused spec '%s' modified the params", bad[i]);
    }
    gdp_workload a, b;
    CHECK_OK(gdp_workload_synthetic(&a, &p, VOCAB));
    CHECK_OK(gdp_workload_synthetic(&b, &p, VOCAB));
    bool ok = a.n_requests == 50, same = true;
    for (int i = 0; ok && i < a.n_requests; i++) {
        const gdp_request_spec *q = &a.requests[i];
        ok &= q->prompt_len == 7 && q->max_new_tokens >= 3 && q->max_new_tokens <= 9 && q->arrival_s >= 0 &&
              (i == 0 || q->arrival_s >= a.requests[i - 1].arrival_s);
        for (int t = 0; t < q->prompt_len; t++)
            ok &= q->prompt[t] >= 0 && q->prompt[t] < VOCAB;
        same &= q->arrival_s == b.requests[i].arrival_s && !memcmp(q->prompt, b.requests[i].prompt, 7 * 4);
    }
    const double span = a.requests[a.n_requests - 1].arrival_s;
    CHECK(ok && same, "synthetic workload: ranges/order ok %d, same seed identical %d", ok, same);
    CHECK(span > 0.2 && span < 1.0, "50 arrivals at 100/s span %.3f s (a Poisson process: ~0.5 s)", span);
    gdp_workload_free(&a), gdp_workload_free(&b);
    printf("workloads: JSONL fields, defaults, order, seeded prompts, 12 refused files; synthetic spec and "
           "generator: checked\n");
}

/* The step buckets (engine_sched.c): every step the scheduler can compose (decode requests up to
 * the slots, S = 1 or S_max, prefill tokens within the budget's rest, 1 .. min(tokens, max_prefill)
 * slices) has a bucket that holds its decode rows, tokens and slices with S; a bucket's head holds
 * its decode rows and one row per slice entry; and a step of few slices does not pay for
 * max_prefill of them: a level's slice entries are one per 64 of its tokens, at least 4 (the
 * budget's level comes twice, the second with max_prefill), so a step whose slices fit that room
 * takes at most max(4, 2 * tokens / 64) entries (its level is under twice its tokens). */
static void units_buckets(void) {
    struct gdp_engine e;
    memset(&e, 0, sizeof e);
    e.cfg.n_slots = 24, e.cfg.max_step_tokens = 1152, e.S_max = 3, e.cp.cp_size = 1, e.max_prefill = 24;
    CHECK(eng_make_buckets(&e) == GDP_STATUS_SUCCESS, "eng_make_buckets failed");
    int64_t steps = 0, small = 0;
    for (int32_t S = 1; S <= e.S_max; S += e.S_max - 1)
        for (int32_t n_dec = 0; n_dec <= e.cfg.n_slots; n_dec++)
            for (int32_t tokens = 0; tokens <= e.cfg.max_step_tokens - n_dec * S; tokens += tokens < 130 ? 1 : 37)
                for (int32_t n_pre = tokens > 0; n_pre <= (tokens < e.max_prefill ? tokens : e.max_prefill); n_pre++) {
                    if (n_dec == 0 && tokens == 0)
                        continue;
                    const int32_t b = eng_bucket_for(&e, S, n_dec, tokens, n_pre);
                    steps++;
                    if (b < 0 || b >= e.n_buckets) {
                        CHECK(0, "no bucket for S %d, %d decode, %d tokens in %d slices", S, n_dec, tokens, n_pre);
                        continue;
                    }
                    const gdp_step_bucket *k = &e.buckets[b];
                    CHECK(e.bucket_S[b] == S && k->decode_count >= n_dec && k->prefill_count >= n_pre &&
                              k->token_count >= n_dec * S + tokens && e.bucket_head[b] >= n_dec * S + n_pre &&
                              e.bucket_head[b] <= e.max_head,
                          "S %d, %d decode, %d tokens in %d slices: bucket %d (S %d, decode %d, %d slices, %d rows, "
                          "head %d)",
                          S, n_dec, tokens, n_pre, b, e.bucket_S[b], k->decode_count, k->prefill_count,
                          k->token_count, e.bucket_head[b]);
                    const int32_t room = 2 * tokens / 64 > 4 ? 2 * tokens / 64 : 4;
                    if (tokens > 0 && n_pre <= tokens / 64) {
                        small++;
                        CHECK(k->prefill_count <= room, "%d tokens in %d slices: %d slice entries, more than %d",
                              tokens, n_pre, k->prefill_count, room);
                    }
                }
    CHECK(small > 1000, "only %lld steps of few slices checked", (long long)small);
    printf("step buckets: %d buckets, %lld steps each in a bucket that holds it (%lld of few slices in a small one)\n",
           e.n_buckets, (long long)steps, (long long)small);
    free(e.bucket_of), free(e.buckets), free(e.bucket_S), free(e.bucket_head);

    /* A decode-only bucket (no CP) has a decode entry for every row where at most n_slots entries
     * cover them, so the layer reads the decode op's output in place (layer.c y_in_place): also
     * at one request, which takes two rows; a one-slot engine keeps its one entry (the warm-up's
     * bucket must cover every other). */
    static const struct { int32_t slots, S_max; } shapes[] = {{24, 3}, {1, 1}, {5, 1}, {128, 4}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        memset(&e, 0, sizeof e);
        e.cfg.n_slots = shapes[i].slots, e.cfg.max_step_tokens = 1024, e.S_max = shapes[i].S_max;
        e.cp.cp_size = 1, e.max_prefill = shapes[i].slots;
        CHECK(eng_make_buckets(&e) == GDP_STATUS_SUCCESS, "eng_make_buckets failed (%d slots)", shapes[i].slots);
        int32_t filled = 0;
        for (int32_t b = 0; b < e.n_buckets; b++) {
            const gdp_step_bucket *k = &e.buckets[b];
            if (k->prefill_count != 0)
                continue;
            const int32_t S = e.bucket_S[b], fits = k->token_count % S == 0 && k->token_count / S <= e.cfg.n_slots;
            CHECK(k->decode_count <= e.cfg.n_slots && k->decode_count * S <= k->token_count &&
                      (!fits || k->decode_count * S == k->token_count),
                  "%d slots, S %d: decode-only bucket %d has %d decode entries for %d rows", shapes[i].slots, S, b,
                  k->decode_count, k->token_count);
            filled += k->decode_count * S == k->token_count;
        }
        CHECK(filled > 0 || e.cfg.n_slots < 2, "%d slots: no decode-only bucket with an entry for every row",
              shapes[i].slots);
        free(e.bucket_of), free(e.buckets), free(e.bucket_S), free(e.bucket_head);
    }
    printf("decode-only buckets: a decode entry for every row within the slots (4 engine shapes)\n");
}

static void units_model(long job) {
    char path[512], path0[512];
    temp_path(path, sizeof path, "model.safetensors", job);
    temp_path(path0, sizeof path0, "layers_only.safetensors", job);
    gdp_layer_config cfg;
    test_config(&cfg);
    CHECK_OK(gdp_checkpoint_write_synthetic(path, &cfg, 77, GDP_DTYPE_FP32));
    gdp_layer_config c0 = cfg;
    c0.vocab_size = 0;
    CHECK_OK(gdp_checkpoint_write_synthetic(path0, &c0, 77, GDP_DTYPE_FP32));
    gdp_checkpoint_t ck = NULL, ck0 = NULL;
    CHECK_OK(gdp_checkpoint_open(&ck, path));
    CHECK_OK(gdp_checkpoint_open(&ck0, path0));
    CHECK_OK(gdp_checkpoint_check(ck, 4));
    gdp_model_weights mw = {.dtype = GDP_DTYPE_INT32};
    CHECK_STATUS(gdp_checkpoint_load_model_weights(ck0, &mw), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "vocab_size 0") != NULL && mw.dtype == GDP_DTYPE_INT32,
          "a checkpoint without vocabulary: message '%s', out modified %d", gdp_last_error(),
          mw.dtype != GDP_DTYPE_INT32);
    CHECK_OK(gdp_checkpoint_load_model_weights(ck, &mw));
    CHECK(mw.embedding.shape[0] == VOCAB && mw.embedding.shape[1] == 64 && mw.final_norm_weight.shape[0] == 64,
          "model weight shapes");

    gdp_ctx_t ctx;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    gdp_model_t m = NULL, m0 = (gdp_model_t)&mw;
    CHECK_STATUS(gdp_model_init(&m0, ctx, NULL, ck0), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(m0 == NULL, "a failed gdp_model_init left *out set");
    CHECK_OK(gdp_model_init(&m, ctx, NULL, ck));

    /* embedding: rows are the embedding's, -1 gives zeros; a bad token changes nothing */
    const int64_t T = 6, D = 64;
    float x[6 * 64], x_copy[6 * 64];
    const int32_t tokens[6] = {5, -1, 127, 0, 5, 64};
    gdp_tensor xt;
    gdp_tensor_init(&xt, x, GDP_DTYPE_FP32, 2, (const int64_t[]){T, D});
    CHECK_OK(gdp_model_embed(m, &xt, tokens, T));
    const float *E = mw.embedding.data;
    bool rows_ok = true;
    for (int64_t i = 0; i < T; i++)
        for (int64_t d = 0; d < D; d++)
            rows_ok &= x[i * D + d] == (tokens[i] < 0 ? 0.0f : E[tokens[i] * D + d]);
    CHECK(rows_ok, "embedded rows are not the embedding's rows");
    memcpy(x_copy, x, sizeof x);
    const int32_t bad_tokens[6] = {1, 2, 128, 3, 4, 5};
    CHECK_STATUS(gdp_model_embed(m, &xt, bad_tokens, T), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "tokens[2] = 128") != NULL && !memcmp(x, x_copy, sizeof x),
          "a bad token: message '%s', x modified %d", gdp_last_error(), memcmp(x, x_copy, sizeof x) != 0);

    /* references to sampled records (the pipelined engine's next step): -2 - h is the token of
     * record h; a reference without records, past n_prev, or to a token outside the
     * vocabulary is refused naming the row, and x is left alone */
    const gdp_sample_out prev[3] = {{.token = 9}, {.token = 127}, {.token = 128}};
    const int32_t ref_tokens[6] = {-3, -1, 4, -2, -3, 0}; /* records 1, pad, 4, record 0, record 1, 0 */
    CHECK_OK(gdp_model_embed_device(m, &xt, ref_tokens, T, prev, 2));
    const int32_t resolved[6] = {127, -1, 4, 9, 127, 0};
    rows_ok = true;
    for (int64_t i = 0; i < T; i++)
        for (int64_t d = 0; d < D; d++)
            rows_ok &= x[i * D + d] == (resolved[i] < 0 ? 0.0f : E[resolved[i] * D + d]);
    CHECK(rows_ok, "references: embedded rows are not the referenced tokens' rows");
    memcpy(x_copy, x, sizeof x);
    const int32_t past[6] = {1, 2, 3, -4, 4, 5}; /* record 2 of 2 */
    CHECK_STATUS(gdp_model_embed_device(m, &xt, past, T, prev, 2), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "tokens[3] = -4") && strstr(gdp_last_error(), "record 2") &&
              !memcmp(x, x_copy, sizeof x),
          "a reference past n_prev: message '%s', x modified %d", gdp_last_error(), memcmp(x, x_copy, sizeof x) != 0);
    CHECK_STATUS(gdp_model_embed_device(m, &xt, past, T, NULL, 0), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "prev is NULL") && !memcmp(x, x_copy, sizeof x),
          "a reference without records: message '%s'", gdp_last_error());
    const int32_t to_bad[6] = {1, 2, 3, 4, -4, 5}; /* record 2 holds 128, outside the vocabulary */
    CHECK_STATUS(gdp_model_embed_device(m, &xt, to_bad, T, prev, 3), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "tokens[4]") && strstr(gdp_last_error(), "token 128") &&
              !memcmp(x, x_copy, sizeof x),
          "a reference to a bad token: message '%s'", gdp_last_error());
    CHECK_STATUS(gdp_model_embed(m, &xt, ref_tokens, T), GDP_STATUS_INVALID_ARGUMENT); /* host tokens: none */
    CHECK(strstr(gdp_last_error(), "tokens[0] = -3") && !memcmp(x, x_copy, sizeof x),
          "gdp_model_embed took a reference: message '%s'", gdp_last_error());

    /* LM head vs double: final RMSNorm (weight 1 here, eps 1e-5) then x . E^T */
    for (int64_t i = 0; i < T * D; i++)
        x[i] = (float)sin(0.37 * (double)i) * 0.3f;
    float logits[6 * VOCAB], one[VOCAB];
    const int32_t rows[5] = {3, 0, 5, 1, 3};
    CHECK_OK(gdp_model_logits(m, logits, &xt, rows, 5));
    double worst = 0;
    for (int r = 0; r < 5; r++) {
        const float *xr = x + rows[r] * D, *nw = mw.final_norm_weight.data;
        double ss = 0;
        for (int64_t d = 0; d < D; d++)
            ss += (double)xr[d] * xr[d];
        const double rstd = 1.0 / sqrt(ss / (double)D + cfg.norm_eps);
        double mx = 0, md = 0;
        for (int64_t v = 0; v < VOCAB; v++) {
            double acc = 0;
            for (int64_t d = 0; d < D; d++)
                acc += (double)xr[d] * rstd * nw[d] * E[v * D + d];
            mx = fmax(mx, fabs(acc));
            md = fmax(md, fabs(acc - logits[r * VOCAB + v]));
        }
        worst = fmax(worst, md / mx);
    }
    CHECK(worst <= 1e-5, "LM head vs double: max|a-b|/max|b| = %.2e > 1e-5", worst);
    /* one row alone gets the bits it gets in a batch (never a one-row BLAS kernel) */
    CHECK_OK(gdp_model_logits(m, one, &xt, &rows[2], 1));
    CHECK(!memcmp(one, logits + 2 * VOCAB, sizeof one), "row 5's logits alone differ from its logits in a batch");
    const int32_t bad_rows[2] = {1, 6};
    memcpy(one, logits, sizeof one);
    CHECK_STATUS(gdp_model_logits(m, logits, &xt, bad_rows, 2), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "rows[1] = 6") != NULL && !memcmp(one, logits, sizeof one),
          "bad row: message '%s'", gdp_last_error());
    printf("model: embedding rows, references to sampled records (bad ones refused), LM head vs double (%.1e), one "
           "row == its batch bits, bad tokens/rows refused\n",
           worst);

    /* engine config errors, one process */
    gdp_engine_config ec;
    CHECK_OK(gdp_engine_config_default(&ec));
    struct { gdp_engine_config c; const char *want; } cases[7];
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n_cases; i++)
        cases[i].c = ec;
    cases[0].c.max_step_tokens = 100, cases[0].want = "max_step_tokens is 100";
    cases[1].c.prefill_chunk = 100, cases[1].want = "prefill_chunk is 100";
    cases[2].c.draft_tokens = 16, cases[2].want = "draft_tokens is 16";
    cases[3].c.n_slots = 0, cases[3].want = "n_slots is 0";
    cases[4].c.schedule = 7, cases[4].want = "schedule is 7";
    cases[5].c.schedule_age_ms = -1, cases[5].want = "schedule_age_ms -1";
    cases[6].c.swap_on_device = 2, cases[6].want = "swap_on_device is 2";
    for (int i = 0; i < n_cases; i++) {
        gdp_engine_t e = (gdp_engine_t)&mw;
        CHECK_STATUS(gdp_engine_init(&e, ctx, NULL, m, &cases[i].c), GDP_STATUS_INVALID_ARGUMENT);
        CHECK(e == NULL && strstr(gdp_last_error(), cases[i].want) != NULL, "config case %d: message '%s' lacks '%s'",
              i, gdp_last_error(), cases[i].want);
    }

    /* a TP = 1 run over a JSONL file; the results file matches the API */
    char wpath[512], opath[512];
    temp_path(wpath, sizeof wpath, "run.jsonl", job);
    temp_path(opath, sizeof opath, "out.jsonl", job);
    write_file(wpath, "{\"id\": 11, \"prompt\": [3, 4, 5, 6, 7, 8, 9], \"max_new_tokens\": 6}\n"
                      "{\"id\": 12, \"prompt_len\": 130, \"max_new_tokens\": 3}\n"
                      "{\"id\": 13, \"prompt_len\": 1, \"max_new_tokens\": 1}\n");
    gdp_workload wl;
    CHECK_OK(gdp_workload_load_jsonl(&wl, wpath, VOCAB, 5));
    ec.n_slots = 2, ec.progress = 0, ec.check_requests = 2;
    gdp_engine_t e = NULL;
    CHECK_OK(gdp_engine_init(&e, ctx, NULL, m, &ec));
    CHECK_OK(gdp_engine_run(e, &wl));
    CHECK_OK(gdp_engine_write_results(e, opath));
    FILE *f = fopen(opath, "r");
    char line[4096];
    int n_lines = 0;
    for (; f != NULL && fgets(line, sizeof line, f) != NULL; n_lines++) {
        gdp_request_result r;
        CHECK_OK(gdp_engine_get_result(e, n_lines, &r));
        char want_line[512];
        int k = snprintf(want_line, sizeof want_line, "{\"id\":%lld,\"prompt_len\":%d,\"tokens\":[", (long long)r.id,
                         r.prompt_len);
        for (int t = 0; t < r.n_generated; t++)
            k += snprintf(want_line + k, sizeof want_line - (size_t)k, "%s%d", t ? "," : "", r.tokens[t]);
        snprintf(want_line + k, sizeof want_line - (size_t)k, "]");
        CHECK(strncmp(line, want_line, strlen(want_line)) == 0, "results line %d '%s' does not start with '%s'",
              n_lines, line, want_line);
        CHECK(r.n_generated == wl.requests[n_lines].max_new_tokens, "request %lld generated %d tokens", (long long)r.id,
              r.n_generated);
    }
    if (f)
        fclose(f);
    CHECK(n_lines == 3, "%d result lines, expected 3", n_lines);
    double cw = 1;
    int32_t checked = 0, mism = 1;
    CHECK_OK(gdp_engine_check(e, &cw, &checked, &mism));
    CHECK(checked == 2 && cw <= BAR_CPU && mism == 0, "self check: %d requests, worst %.2e, mismatches %d", checked,
          cw, mism);
    gdp_request_result r;
    CHECK_STATUS(gdp_engine_get_result(e, 3, &r), GDP_STATUS_INVALID_ARGUMENT);
    /* a refused run (a token outside the vocabulary) keeps the last run's results */
    CHECK_OK(gdp_engine_get_result(e, 0, &r));
    int32_t kept[8];
    memcpy(kept, r.tokens, sizeof(int32_t) * (size_t)r.n_generated);
    const int32_t n_kept = r.n_generated;
    wl.requests[1].prompt[3] = VOCAB;
    CHECK_STATUS(gdp_engine_run(e, &wl), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "prompt[3] = 128") != NULL, "refused run: message '%s'", gdp_last_error());
    CHECK_OK(gdp_engine_get_result(e, 0, &r));
    CHECK(r.n_generated == n_kept && !memcmp(r.tokens, kept, sizeof(int32_t) * (size_t)n_kept),
          "a refused run changed the last run's results");
    printf("engine: 4 bad configs refused; a TP = 1 JSONL run, its results file, self check %.1e: checked\n", cw);
    gdp_engine_free(e);
    gdp_workload_free(&wl);
    gdp_model_free(m);
    gdp_model_weights_free(&mw);
    gdp_checkpoint_free(ck), gdp_checkpoint_free(ck0);
    gdp_ctx_free(ctx);
    remove(path), remove(path0), remove(wpath), remove(opath);
}

/* ======================================================================================
 * mpi: variants across TP sizes
 * ====================================================================================== */

/* How a variant's tokens must compare with the base run's at the same TP size. */
typedef enum match {
    MATCH_MARGIN = 0, /* identical up to the first token with a margin below the logit bar   */
    MATCH_TOKENS,     /* identical tokens: the same per-request math, another schedule       */
    MATCH_BITWISE,    /* identical tokens and logit margins bit for bit: the same schedule   */
} match;

typedef struct variant {
    const char *name;
    int32_t     slots, chunk, draft, preempt, graphs, timed;
    match       vs_base;
    int32_t     sampled; /* the sampled workload (temperature, top-k, top-p, stop ids); compared
                            with the first sampled variant instead of the base */
    int32_t     no_overlap; /* config.overlap 0: each step composed after the last finished */
    int32_t     stops;      /* the greedy stop workload: stop ids, max_new_tokens 1 on some */
    int32_t     vs;         /* > 0: compared with this variant instead */
    int32_t     fcfs;       /* config.schedule FCFS instead of the default (shortest prompt first) */
    int32_t     host_swap;  /* config.swap_on_device 0: preempted states in pinned host memory (CUDA) */
} variant;

#define FIRST_STOPS 14 /* the first variant of the stop workload */
static const variant k_variants[] = {
    {"base", 16, 64, 0, 0, 1, 0, MATCH_BITWISE, 0, 0, 0, 0, 0, 0},
    {"preempt", 3, 64, 0, 1, 1, 0, MATCH_TOKENS, 0, 0, 0, 0, 0, 0},
    {"no-graphs", 16, 64, 0, 0, 0, 0, MATCH_BITWISE, 0, 0, 0, 0, 0, 0},
    {"arrivals", 16, 64, 0, 0, 1, 1, MATCH_TOKENS, 0, 0, 0, 0, 0, 0},
    {"drafts", 16, 64, 3, 0, 1, 0, MATCH_TOKENS, 0, 0, 0, 0, 0, 0},
    {"drafts+preempt", 3, 64, 3, 1, 1, 0, MATCH_TOKENS, 0, 0, 0, 0, 0, 0},
    {"whole", 16, 0, 0, 0, 1, 0, MATCH_MARGIN, 0, 0, 0, 0, 0, 0},
    {"slices-128", 16, 128, 0, 0, 1, 0, MATCH_MARGIN, 0, 0, 0, 0, 0, 0},
    {"sampled", 16, 64, 0, 0, 1, 0, MATCH_TOKENS, 1, 0, 0, 0, 0, 0},
    {"sampled+preempt", 3, 64, 0, 1, 1, 0, MATCH_TOKENS, 1, 0, 0, 0, 0, 0},
    {"sampled+drafts", 16, 64, 3, 0, 0, 1, MATCH_TOKENS, 1, 0, 0, 0, 0, 0},
    /* overlap (the default above) vs one step at a time: the same schedule where no request
     * stops early; a stop id frees its slot one step later when overlapping */
    {"no-overlap", 16, 64, 0, 0, 1, 0, MATCH_BITWISE, 0, 1, 0, 0, 0, 0},
    {"preempt no-overlap", 3, 64, 0, 1, 1, 0, MATCH_TOKENS, 0, 1, 0, 0, 0, 0},
    {"sampled no-overlap", 16, 64, 0, 0, 1, 0, MATCH_TOKENS, 1, 1, 0, 0, 0, 0},
    {"stops", 4, 64, 0, 0, 1, 0, MATCH_TOKENS, 0, 0, 1, 0, 0, 0},
    {"stops no-overlap", 4, 64, 0, 0, 1, 0, MATCH_TOKENS, 0, 1, 1, FIRST_STOPS, 0, 0},
    {"stops no-graphs", 4, 64, 0, 0, 0, 0, MATCH_TOKENS, 0, 0, 1, FIRST_STOPS, 0, 0},
    /* arrival order instead of shortest first: another admission order, the same tokens */
    {"fcfs", 3, 64, 0, 0, 1, 0, MATCH_TOKENS, 0, 0, 0, 0, 1, 0},
};
#define FIRST_SAMPLED 8
#define STOP_A 5
#define STOP_B 17
#define N_VARIANTS ((int)(sizeof k_variants / sizeof k_variants[0]))

typedef struct result {
    int32_t valid, tp;
    int32_t n_gen[NREQ], finish[NREQ];
    int32_t tokens[NREQ][NEW];
    float   margin[NREQ][NEW], scale[NREQ][NEW];
    int32_t requests;
    int64_t generated, preemptions, resumes, drafts_proposed, drafts_accepted, captures, replays, overlapped;
    double  check_worst;
    int32_t check_checked, check_mismatches;
    double  phase_s[GDP_PHASE_NUM], device_s; /* the report's step phases and device time */
} result;

static gdp_workload g_wl, g_wl_timed, g_wl_sampled, g_wl_sampled_timed, g_wl_stops;

/* The stop workload: greedy; requests 0, 3, 6, 9 ask for one token, the even ones stop at
 * STOP_A or STOP_B (4 slots: requests stop while their next row is already composed, and
 * others wait for their slots). */
static int32_t stops_max_new(int i) { return i % 3 == 0 ? 1 : NEW; }
static void make_stops(gdp_workload *wl) {
    for (int32_t i = 0; i < wl->n_requests; i++) {
        gdp_request_spec *q = &wl->requests[i];
        q->max_new_tokens = stops_max_new(i);
        q->n_stop = i % 2 == 0 ? 2 : 0;
        q->stop[0] = STOP_A, q->stop[1] = STOP_B;
    }
}

/* The sampled workload: the same prompts, each request with its own seed and options. */
static void make_sampled(gdp_workload *wl) {
    for (int32_t i = 0; i < wl->n_requests; i++) {
        gdp_request_spec *q = &wl->requests[i];
        q->sampling = (gdp_sampling_params){.temperature = i % 3 == 0 ? 1.3f : 0.8f, .top_k = i % 2 ? 20 : 0,
                                            .top_p = i % 4 == 1 ? 0.9f : 1.0f, .seed = 1000u + 7u * (uint64_t)i};
        q->n_stop = i % 2 == 0 ? 2 : 0;
        q->stop[0] = STOP_A, q->stop[1] = STOP_B;
    }
}

static void make_workloads(void) {
    gdp_synthetic_workload p;
    gdp_workload_synthetic_default(&p);
    p.n_requests = NREQ, p.rate = 0, p.prompt_min = 5, p.prompt_max = 150, p.new_min = p.new_max = NEW, p.seed = 3;
    GDP_FATAL_IF_ERROR(NULL, gdp_workload_synthetic(&g_wl, &p, VOCAB));
    p.rate = 300; /* ten requests over ~30 ms: they join running batches at different steps */
    GDP_FATAL_IF_ERROR(NULL, gdp_workload_synthetic(&g_wl_timed, &p, VOCAB));
    GDP_FATAL_IF_ERROR(NULL, gdp_workload_synthetic(&g_wl_sampled_timed, &p, VOCAB));
    p.rate = 0;
    GDP_FATAL_IF_ERROR(NULL, gdp_workload_synthetic(&g_wl_sampled, &p, VOCAB));
    GDP_FATAL_IF_ERROR(NULL, gdp_workload_synthetic(&g_wl_stops, &p, VOCAB));
    make_sampled(&g_wl_sampled), make_sampled(&g_wl_sampled_timed), make_stops(&g_wl_stops);
}

static gdp_dtype_t g_ssm_dtype = GDP_DTYPE_FP32; /* the cache's recurrent state of the next runs */

static void engine_config(const variant *v, gdp_engine_config *c) {
    gdp_engine_config_default(c);
    c->ssm_dtype = g_ssm_dtype;
    c->n_slots = v->slots, c->max_step_tokens = BUDGET, c->prefill_chunk = v->chunk, c->draft_tokens = v->draft;
    c->preempt = v->preempt, c->preempt_after = 2, c->preempt_wait_ms = 0, c->cuda_graphs = v->graphs;
    c->honor_arrivals = v->timed;
    c->progress = 0, c->check_requests = !strcmp(v->name, "base") || !strcmp(v->name, "no-overlap") ? 3 : 0;
    c->overlap = !v->no_overlap;
    if (v->fcfs)
        c->schedule = GDP_SCHEDULE_FCFS;
    c->swap_on_device = !v->host_swap;
}

/* The checkpoint at path and its model on ctx (comm: the model's TP group; NULL for TP = 1). */
static void load_model(const char *path, gdp_ctx_t ctx, gdp_comm_t comm, gdp_checkpoint_t *ck, gdp_model_t *model) {
    GDP_FATAL_IF_ERROR(comm, gdp_checkpoint_open(ck, path));
    GDP_FATAL_IF_ERROR(comm, gdp_model_init(model, ctx, comm, *ck));
}

/* Frees a load_model's model and checkpoint, then the ctx. */
static void free_model(gdp_ctx_t ctx, gdp_checkpoint_t ck, gdp_model_t model) {
    gdp_model_free(model);
    gdp_checkpoint_free(ck);
    gdp_ctx_free(ctx);
}

/* The admission order of config.schedule, seen in the first-token times of one slot (one
 * request at a time, no preemption) on the CPU, this rank alone: shortest first (an age
 * bound no run reaches) admits by prompt length, ties by workload order; FCFS, and shortest
 * with an age bound of 0 (every waiter is due at once), by workload order. */
static void schedule_order(const char *ckpt_path) {
    struct {
        const char *name;
        int32_t schedule, age_ms, by_length;
    } cases[] = {{"shortest", GDP_SCHEDULE_SHORTEST, 1 << 30, 1},
                 {"fcfs", GDP_SCHEDULE_FCFS, 2000, 0},
                 {"shortest, age 0", GDP_SCHEDULE_SHORTEST, 0, 0}};
    gdp_ctx_t ctx;
    GDP_FATAL_IF_ERROR(NULL, gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    gdp_checkpoint_t ck;
    gdp_model_t model;
    load_model(ckpt_path, ctx, NULL, &ck, &model);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        gdp_engine_config c;
        gdp_engine_config_default(&c);
        c.n_slots = 1, c.max_step_tokens = BUDGET, c.prefill_chunk = 64, c.preempt = 0, c.progress = 0;
        c.schedule = cases[k].schedule, c.schedule_age_ms = cases[k].age_ms;
        gdp_engine_t e;
        GDP_FATAL_IF_ERROR(NULL, gdp_engine_init(&e, ctx, NULL, model, &c));
        GDP_FATAL_IF_ERROR(NULL, gdp_engine_run(e, &g_wl));
        /* the expected order: workload indices sorted by (prompt length when by_length, index) */
        int32_t want[NREQ], len[NREQ];
        double first[NREQ];
        for (int i = 0; i < NREQ; i++) {
            gdp_request_result r;
            GDP_FATAL_IF_ERROR(NULL, gdp_engine_get_result(e, i, &r));
            want[i] = i, len[i] = r.prompt_len, first[i] = r.first_token_s;
        }
        for (int i = 1; i < NREQ; i++) /* insertion sort: stable, so ties keep workload order */
            for (int j = i; j > 0 && cases[k].by_length && len[want[j]] < len[want[j - 1]]; j--) {
                const int32_t t = want[j];
                want[j] = want[j - 1], want[j - 1] = t;
            }
        int out_of_order = 0;
        for (int i = 1; i < NREQ; i++)
            out_of_order += !(first[want[i - 1]] < first[want[i]]);
        CHECK(out_of_order == 0, "schedule %s: %d of %d requests got their first token out of the expected order",
              cases[k].name, out_of_order, NREQ);
        printf("schedule %s (1 slot): first tokens in %s order: %s\n", cases[k].name,
               cases[k].by_length ? "prompt-length" : "arrival", out_of_order == 0 ? "ok" : "FAILED");
        gdp_engine_free(e);
    }
    free_model(ctx, ck, model);
}

/* Runs variant v on the ranks of `group` (MPI_COMM_NULL: this rank alone), into *out (root). */
static void run_variant(const char *ckpt_path, MPI_Comm group, const variant *v, gdp_backend_t backend,
                        result *out) {
    memset(out, 0, sizeof *out);
    gdp_comm_t comm = NULL;
    int32_t grank = 0, device = 0;
    if (group != MPI_COMM_NULL) {
        const bool nccl = backend == GDP_BACKEND_CUDA && gdp_comm_backend_available(GDP_COMM_NCCL);
        gdp_status_t st = gdp_comm_init(&comm, nccl ? GDP_COMM_NCCL : GDP_COMM_MPI, &group,
                                        backend == GDP_BACKEND_CUDA ? GDP_COMM_DEVICE_BUFFERS : GDP_COMM_HOST_BUFFERS);
        if (st != GDP_STATUS_SUCCESS && nccl) /* more ranks than GPUs: host-staged MPI */
            st = gdp_comm_init(&comm, GDP_COMM_MPI, &group, GDP_COMM_DEVICE_BUFFERS);
        GDP_FATAL_IF_ERROR(NULL, st);
        gdp_comm_rank(comm, &grank);
        if (backend == GDP_BACKEND_CUDA)
            gdp_comm_device(comm, &device);
    }
    gdp_ctx_t ctx;
    GDP_FATAL_IF_ERROR(comm, gdp_ctx_init(&ctx, backend, device));
#ifdef GDP_HAVE_CUDA
    cudaStream_t stream = NULL;
    if (backend == GDP_BACKEND_CUDA) {
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
            GDP_FATAL(comm, "cudaStreamCreateWithFlags failed");
        GDP_FATAL_IF_ERROR(comm, gdp_ctx_set_stream(ctx, stream));
    }
#endif
    gdp_checkpoint_t ck;
    gdp_model_t model;
    load_model(ckpt_path, ctx, comm, &ck, &model);
    gdp_engine_config ec;
    engine_config(v, &ec);
    gdp_engine_t e;
    GDP_FATAL_IF_ERROR(comm, gdp_engine_init(&e, ctx, comm, model, &ec));
    const gdp_workload *wl = v->stops ? &g_wl_stops
                             : v->sampled ? (v->timed ? &g_wl_sampled_timed : &g_wl_sampled)
                                          : (v->timed ? &g_wl_timed : &g_wl);
    GDP_FATAL_IF_ERROR(comm, gdp_engine_run(e, grank == 0 ? wl : NULL));
    if (ec.check_requests > 0)
        GDP_FATAL_IF_ERROR(comm, gdp_engine_check(e, &out->check_worst, &out->check_checked, &out->check_mismatches));
    if (grank == 0) {
        gdp_engine_report rep;
        gdp_engine_get_report(e, &rep);
        out->valid = 1;
        out->requests = rep.requests, out->generated = rep.generated_tokens, out->preemptions = rep.preemptions;
        out->resumes = rep.resumes, out->drafts_proposed = rep.drafts_proposed;
        out->drafts_accepted = rep.drafts_accepted, out->captures = rep.graph_captures + rep.graphs_at_init;
        out->replays = rep.graph_replays, out->tp = rep.tp_size, out->overlapped = rep.overlapped_steps;
        memcpy(out->phase_s, rep.phase_s, sizeof out->phase_s);
        out->device_s = rep.device_s;
        for (int i = 0; i < NREQ; i++) {
            gdp_request_result r;
            GDP_FATAL_IF_ERROR(comm, gdp_engine_get_result(e, i, &r));
            /* results are in workload order; the timed workload has the same requests */
            out->n_gen[i] = r.n_generated;
            out->finish[i] = r.finish_reason;
            for (int t = 0; t < r.n_generated && t < NEW; t++) {
                out->tokens[i][t] = r.tokens[t];
                out->margin[i][t] = r.margin[t];
                out->scale[i][t] = r.logit_scale[t];
            }
        }
    }
    gdp_engine_free(e);
    free_model(ctx, ck, model);
#ifdef GDP_HAVE_CUDA
    if (stream != NULL)
        cudaStreamDestroy(stream);
#endif
    gdp_comm_free(comm);
}

static double g_bar = BAR_CPU;
static int64_t g_compared = 0, g_total = 0;

/* Tokens identical up to the first token whose margin is below the bar in either run
 * (MATCH_MARGIN), or throughout (MATCH_TOKENS; MATCH_BITWISE: margins bit for bit too). */
static void compare(const char *what, const result *a, const result *b, match how) {
    if (!a->valid || !b->valid)
        return;
    int64_t same = 0, cut = 0, diff = 0;
    if (how != MATCH_MARGIN) /* the same tokens end each request the same way */
        for (int i = 0; i < NREQ; i++)
            CHECK(a->n_gen[i] == b->n_gen[i] && a->finish[i] == b->finish[i],
                  "%s: request %d: %d tokens (finish %d) vs %d (finish %d)", what, i, a->n_gen[i], a->finish[i],
                  b->n_gen[i], b->finish[i]);
    double margin_diff = 0; /* the largest |margin a - margin b| / max |logit| of identical tokens */
    for (int i = 0; i < NREQ; i++) {
        const int n = a->n_gen[i] < b->n_gen[i] ? a->n_gen[i] : b->n_gen[i];
        for (int t = 0; t < n; t++) {
            if (how == MATCH_MARGIN &&
                (a->margin[i][t] < g_bar * a->scale[i][t] || b->margin[i][t] < g_bar * b->scale[i][t])) {
                cut += n - t; /* no claim from here on */
                break;
            }
            if (a->tokens[i][t] != b->tokens[i][t] || (how == MATCH_BITWISE && a->margin[i][t] != b->margin[i][t])) {
                diff++;
                CHECK(false, "%s: request %d token %d: %d (margin %.9g) vs %d (margin %.9g)%s", what, i, t,
                      a->tokens[i][t], a->margin[i][t], b->tokens[i][t], b->margin[i][t],
                      how == MATCH_BITWISE ? " (the same schedule: logits must be identical bit for bit)"
                      : how == MATCH_TOKENS ? " (tokens must be identical)" : "");
                break;
            }
            margin_diff = fmax(margin_diff, fabs((double)a->margin[i][t] - b->margin[i][t]) / b->scale[i][t]);
            same++;
        }
    }
    g_compared += same, g_total += same + cut + diff;
    static const char *const kind[] = {"margin ", "tokens ", "bitwise"};
    printf("  %-38s %s: %3lld tokens identical, %3lld past a small margin; margins differ by <= %.1e x max|logit|\n",
           what, kind[how], (long long)same, (long long)cut, margin_diff);
}

static void check_result(const char *what, const variant *v, const result *r) {
    if (!r->valid)
        return;
    if (v->stops) { /* ends at its first stop token, else at its max_new_tokens */
        int64_t total = 0;
        int stopped = 0;
        for (int i = 0; i < NREQ; i++) {
            int end = stops_max_new(i);
            for (int t = 0; t < r->n_gen[i] && t < end; t++)
                if (i % 2 == 0 && (r->tokens[i][t] == STOP_A || r->tokens[i][t] == STOP_B))
                    end = t + 1;
            const int want_finish = end < stops_max_new(i) || (i % 2 == 0 && r->n_gen[i] > 0 &&
                                    (r->tokens[i][r->n_gen[i] - 1] == STOP_A || r->tokens[i][r->n_gen[i] - 1] == STOP_B))
                                        ? GDP_FINISH_STOP : GDP_FINISH_LENGTH;
            stopped += want_finish == GDP_FINISH_STOP && end > 1;
            CHECK(r->n_gen[i] == end && r->finish[i] == want_finish,
                  "%s: request %d generated %d tokens (finish %d); want %d (finish %d)", what, i, r->n_gen[i],
                  r->finish[i], end, want_finish);
            total += r->n_gen[i];
        }
        CHECK(r->requests == NREQ && r->generated == total, "%s: %d requests finished, %lld tokens generated", what,
              r->requests, (long long)r->generated);
        CHECK(stopped >= 1, "%s: no request stopped early at a stop id after its first token: the test shows nothing",
              what);
    } else if (v->sampled) { /* a request with stop ids ends at its first stop token, else at NEW */
        int64_t total = 0;
        for (int i = 0; i < NREQ; i++) {
            int first_stop = NEW;
            for (int t = 0; t < r->n_gen[i] && first_stop == NEW; t++)
                if (i % 2 == 0 && (r->tokens[i][t] == STOP_A || r->tokens[i][t] == STOP_B))
                    first_stop = t + 1;
            CHECK(r->n_gen[i] == first_stop, "%s: request %d generated %d tokens; its stop ids end it after %d", what,
                  i, r->n_gen[i], first_stop);
            total += r->n_gen[i];
        }
        CHECK(r->requests == NREQ && r->generated == total, "%s: %d requests finished, %lld tokens generated", what,
              r->requests, (long long)r->generated);
    } else {
        bool all = r->requests == NREQ && r->generated == (int64_t)NREQ * NEW;
        for (int i = 0; i < NREQ; i++)
            all &= r->n_gen[i] == NEW;
        CHECK(all, "%s: %d requests finished, %lld tokens generated (want %d, %d)", what, r->requests,
              (long long)r->generated, NREQ, NREQ * NEW);
    }
    if (v->preempt)
        CHECK(r->preemptions > 0 && r->resumes == r->preemptions, "%s: %lld preemptions, %lld resumes", what,
              (long long)r->preemptions, (long long)r->resumes);
    else
        CHECK(r->preemptions == 0, "%s: %lld preemptions with preemption off", what, (long long)r->preemptions);
    if (v->draft)
        /* sampled drafts are seldom the draw (the drafter copies earlier text): none may be kept */
        CHECK(r->drafts_proposed > 0 && (v->sampled || r->drafts_accepted > 0) &&
                  r->drafts_accepted <= r->drafts_proposed,
              "%s: drafts proposed %lld, accepted %lld", what, (long long)r->drafts_proposed,
              (long long)r->drafts_accepted);
    /* drafts finish every step at once; otherwise most steps are composed ahead */
    if (v->no_overlap || v->draft)
        CHECK(r->overlapped == 0, "%s: %lld steps composed ahead with overlap off or drafts", what,
              (long long)r->overlapped);
    else
        CHECK(r->overlapped > 0, "%s: no step was composed while the previous one ran", what);
    if (v->graphs)
        CHECK(r->captures > 0 && r->replays > 0, "%s: graph hooks: %lld captures, %lld replays", what,
              (long long)r->captures, (long long)r->replays);
    else
        CHECK(r->captures == 0 && r->replays == 0, "%s: graphs off but %lld captures", what, (long long)r->captures);
    if (!strcmp(v->name, "base"))
        CHECK(r->check_checked == 3 && r->check_worst <= (g_cuda || g_ssm_dtype != GDP_DTYPE_FP32 ? BAR_GPU : BAR_CPU) &&
                  r->check_mismatches == 0,
              "%s: decode vs recompute: %d checked, worst %.2e, %d mismatches", what, r->check_checked,
              r->check_worst, r->check_mismatches);
}

/* Results[tp index][variant]. */
static result g_res[3][N_VARIANTS];
static const int k_tps[3] = {1, 2, 4};

static void mpi_variants(const char *path) {
    for (int ti = 0; ti < 3; ti++) {
        const int tp = k_tps[ti];
        if (g_size % tp != 0 || tp > g_size)
            continue;
        /* TP = 4 runs only the base: its comparisons with TP 1 and 2 are the point. */
        const int n_var = tp == 4 ? 1 : N_VARIANTS, groups = g_size / tp, my_group = g_rank / tp;
        MPI_Comm group = MPI_COMM_NULL;
        if (tp > 1)
            MPI_Comm_split(MPI_COMM_WORLD, my_group, g_rank, &group);
        for (int k = my_group; k < n_var; k += groups)
            run_variant(path, group, &k_variants[k], GDP_BACKEND_CPU, &g_res[ti][k]);
        for (int k = 0; k < n_var; k++) /* every rank gets every result from its group's root */
            MPI_Bcast(&g_res[ti][k], sizeof(result), MPI_BYTE, (k % groups) * tp, MPI_COMM_WORLD);
        if (group != MPI_COMM_NULL)
            MPI_Comm_free(&group);
    }
    if (g_rank != 0)
        return;
    for (int ti = 0; ti < 3; ti++)
        for (int k = 0; k < N_VARIANTS; k++) {
            char what[96];
            snprintf(what, sizeof what, "tp %d %s", k_tps[ti], k_variants[k].name);
            check_result(what, &k_variants[k], &g_res[ti][k]);
        }
    /* The report's phases on the CPU (clocks, every step split by its marks): the GEMMs, the GDP
     * ops and the head ran in every run, and the device phases add up to the device time. */
    for (int ti = 0; ti < 3; ti++)
        for (int k = 0; k < N_VARIANTS; k++) {
            const result *r = &g_res[ti][k];
            if (!r->valid)
                continue;
            double sum = 0;
            for (int p = 0; p < GDP_PHASE_HOST; p++)
                sum += r->phase_s[p];
            CHECK(r->phase_s[GDP_PHASE_GEMM] > 0 && r->phase_s[GDP_PHASE_GDP_OPS] > 0 && r->phase_s[GDP_PHASE_HEAD] > 0 &&
                      r->device_s > 0 && fabs(sum - r->device_s) <= 1e-6 * r->device_s,
                  "tp %d %s: report phases GEMM %.3g s, GDP ops %.3g s, head %.3g s, their sum with the collectives "
                  "%.6g s against a device time of %.6g s",
                  k_tps[ti], k_variants[k].name, r->phase_s[GDP_PHASE_GEMM], r->phase_s[GDP_PHASE_GDP_OPS],
                  r->phase_s[GDP_PHASE_HEAD], sum, r->device_s);
        }
    /* The model must not be degenerate, or identical tokens prove nothing: a random model
     * repeats tokens in runs, and where a run ends is up to the recurrent state. */
    const result *b1 = &g_res[0][0];
    int switches = 0;
    for (int i = 0; i < NREQ; i++)
        for (int t = 1; t < NEW; t++)
            switches += b1->tokens[i][t] != b1->tokens[i][t - 1];
    CHECK(switches >= 2 * NREQ, "the base run's tokens change only %d times over %d requests: the test model is too "
          "degenerate for token comparisons to mean anything", switches, NREQ);
    printf("# generated tokens (the next token differs from the last %d times in %d), logit bar %.0e x max|logit|:\n",
           switches, NREQ * (NEW - 1), g_bar);
    for (int ti = 0; ti < 3; ti++) {
        const result *r = g_res[ti];
        if (!r[0].valid)
            continue;
        char what[96];
        for (int k = 1; k < N_VARIANTS; k++) {
            if (k == FIRST_SAMPLED)
                continue;
            if (k == FIRST_STOPS)
                continue;
            const int base = k_variants[k].vs > 0 ? k_variants[k].vs : k_variants[k].sampled ? FIRST_SAMPLED : 0;
            snprintf(what, sizeof what, "tp %d: %s vs %s", k_tps[ti], k_variants[base].name, k_variants[k].name);
            compare(what, &r[base], &r[k], k_variants[k].vs_base);
        }
        if (r[FIRST_SAMPLED].valid) { /* sampling must change tokens, or the comparisons prove nothing */
            int differ = 0;
            for (int i = 0; i < NREQ; i++)
                for (int t = 0; t < r[FIRST_SAMPLED].n_gen[i]; t++)
                    differ += r[FIRST_SAMPLED].tokens[i][t] != r[0].tokens[i][t];
            CHECK(differ >= NREQ, "tp %d: the sampled run differs from greedy in only %d tokens", k_tps[ti], differ);
        }
        if (ti > 0) {
            snprintf(what, sizeof what, "tp 1 vs tp %d (base)", k_tps[ti]);
            compare(what, &g_res[0][0], &r[0], MATCH_MARGIN);
        }
    }
    CHECK(g_total > 0 && g_compared >= g_total * 8 / 10, "only %lld of %lld token comparisons made a claim",
          (long long)g_compared, (long long)g_total);
}

/* The base run with a bf16 recurrent state (gdp_engine_config.ssm_dtype, gdp-run --ssm-state)
 * on this rank alone: it must run to the end as the fp32 run does, and its greedy tokens must
 * follow the fp32 run's under the margin rule with the bf16 bar (BAR_GPU: the state rounded to
 * bf16 after every token is an error of the bf16 activations' size, not of the CPU's fp32); its
 * decode-vs-recompute self check is held to that bar too (measured on the CPU: 5.7e-3). */
static void ssm_bf16_vs_fp32(const char *path, gdp_backend_t backend, const result *fp32) {
    result r;
    g_ssm_dtype = GDP_DTYPE_BF16;
    run_variant(path, MPI_COMM_NULL, &k_variants[0], backend, &r);
    check_result("base, bf16 ssm state", &k_variants[0], &r); /* its self check at the bf16 bar */
    g_ssm_dtype = GDP_DTYPE_FP32;
    const double bar = g_bar;
    g_bar = BAR_GPU;
    compare(backend == GDP_BACKEND_CPU ? "cpu tp 1: fp32 vs bf16 ssm state" : "cuda tp 1: fp32 vs bf16 ssm state",
            fp32, &r, MATCH_MARGIN);
    g_bar = bar;
}

/* Bad input at TP = all ranks: errors on every rank, and the engine runs afterwards. */
static void mpi_bad_input(const char *path) {
    gdp_comm_t comm = NULL;
    if (g_size > 1)
        GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&comm, GDP_COMM_MPI, NULL, GDP_COMM_HOST_BUFFERS));
    gdp_ctx_t ctx;
    GDP_FATAL_IF_ERROR(comm, gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    gdp_checkpoint_t ck;
    gdp_model_t model;
    load_model(path, ctx, comm, &ck, &model);
    gdp_engine_config ec;
    engine_config(&k_variants[0], &ec);
    ec.check_requests = 0;
    ec.max_step_tokens = 40;
    gdp_engine_t e = (gdp_engine_t)&ec;
    CHECK_STATUS(gdp_engine_init(&e, ctx, comm, model, &ec), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(e == NULL && strstr(gdp_last_error(), "max_step_tokens is 40") && strstr(gdp_last_error(), ">= 80"),
          "rank %d: small budget: message '%s'", g_rank, gdp_last_error());
    ec.max_step_tokens = BUDGET;
    GDP_FATAL_IF_ERROR(comm, gdp_engine_init(&e, ctx, comm, model, &ec));

    /* a token outside the vocabulary */
    const int32_t keep = g_wl.requests[7].prompt[2];
    g_wl.requests[7].prompt[2] = 200;
    const gdp_status_t want = g_rank == 0 ? GDP_STATUS_INVALID_ARGUMENT : GDP_STATUS_REMOTE_ERROR;
    CHECK_STATUS(gdp_engine_run(e, g_rank == 0 ? &g_wl : NULL), want);
    char id[64];
    snprintf(id, sizeof id, "request %lld: prompt[2] = 200", (long long)g_wl.requests[7].id);
    CHECK(strstr(gdp_last_error(), id) != NULL, "rank %d: message '%s' lacks '%s'", g_rank, gdp_last_error(), id);
    g_wl.requests[7].prompt[2] = keep;
    gdp_request_result r;
    CHECK_STATUS(gdp_engine_get_result(e, 0, &r), GDP_STATUS_INVALID_USAGE);
    /* a check without kept logits */
    double w;
    int32_t c, mm;
    CHECK_STATUS(gdp_engine_check(e, &w, &c, &mm), g_rank == 0 ? GDP_STATUS_INVALID_USAGE : GDP_STATUS_REMOTE_ERROR);
    /* the engine still serves, with the same tokens as the base run at this TP size */
    CHECK_OK(gdp_engine_run(e, g_rank == 0 ? &g_wl : NULL));
    if (g_rank == 0) {
        CHECK_OK(gdp_engine_get_result(e, 7, &r));
        const int ti = g_size == 4 ? 2 : g_size == 2 ? 1 : 0;
        CHECK(r.n_generated == NEW && (!g_res[ti][0].valid || !memcmp(r.tokens, g_res[ti][0].tokens[7], NEW * 4)),
              "after a refused run, request 7 generated %d tokens, different from the base run's", r.n_generated);
        CHECK_STATUS(gdp_engine_get_result(e, NREQ, &r), GDP_STATUS_INVALID_ARGUMENT);
    } else {
        CHECK_STATUS(gdp_engine_get_result(e, 0, &r), GDP_STATUS_INVALID_USAGE);
        CHECK(strstr(gdp_last_error(), "root") != NULL, "off-root message '%s'", gdp_last_error());
    }
    gdp_engine_free(e);

    /* A fresh model for the next engine: gdp_layer_forward skips its ranks' agreement when it
     * sees the cache pointer it last agreed on, and a new cache may get a freed one's address
     * on one rank only (reported to the layer's owner); new layers start unpaired. */
    gdp_model_free(model);
    GDP_FATAL_IF_ERROR(comm, gdp_model_init(&model, ctx, comm, ck));
    /* a whole prompt larger than the budget */
    ec.prefill_chunk = 0, ec.max_step_tokens = 100;
    GDP_FATAL_IF_ERROR(comm, gdp_engine_init(&e, ctx, comm, model, &ec));
    CHECK_STATUS(gdp_engine_run(e, g_rank == 0 ? &g_wl : NULL), want);
    CHECK(strstr(gdp_last_error(), "whole-prompt") != NULL && strstr(gdp_last_error(), "max_step_tokens 100") != NULL,
          "rank %d: whole-prompt message '%s'", g_rank, gdp_last_error());
    gdp_engine_free(e);
    free_model(ctx, ck, model);
    gdp_comm_free(comm);
    if (g_rank == 0)
        printf("bad input: small budget, token outside the vocabulary, whole prompt over the budget, results off the "
               "root, check without logits: refused on every rank; the engine serves afterwards\n");
}

/* --backend cuda: CUDA variants at TP = ranks, CUDA and CPU TP = 1 on rank 0. */
static void gpu_variants(const char *path) {
    g_bar = BAR_GPU;
    static const int k_gpu[] = {0, 1, 2, 4, 6, 8, 9}; /* base, preempt, no-graphs, drafts, whole, sampled x2 */
    enum { N_GPU = sizeof k_gpu / sizeof k_gpu[0] };
    result cuda[N_GPU], cuda1, cpu1, host_swapped;
    memset(&cuda1, 0, sizeof cuda1), memset(&cpu1, 0, sizeof cpu1);
    for (int k = 0; k < N_GPU; k++)
        run_variant(path, g_size > 1 ? MPI_COMM_WORLD : MPI_COMM_NULL, &k_variants[k_gpu[k]], GDP_BACKEND_CUDA,
                    &cuda[k]);
    /* the preempt variant again with its swaps through pinned host memory instead of device memory (the
     * default): the same schedule and the same bytes moved, so the same tokens and margins bit for bit */
    variant host_swap = k_variants[k_gpu[1]];
    host_swap.name = "preempt host-swap";
    host_swap.host_swap = 1;
    run_variant(path, g_size > 1 ? MPI_COMM_WORLD : MPI_COMM_NULL, &host_swap, GDP_BACKEND_CUDA, &host_swapped);
    if (g_rank == 0 && g_size > 1) {
        run_variant(path, MPI_COMM_NULL, &k_variants[0], GDP_BACKEND_CUDA, &cuda1);
        run_variant(path, MPI_COMM_NULL, &k_variants[0], GDP_BACKEND_CPU, &cpu1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank != 0)
        return;
    printf("# CUDA, tp %d, logit bar %.0e x max|logit|:\n", g_size, g_bar);
    for (int k = 0; k < N_GPU; k++)
        check_result(k_variants[k_gpu[k]].name, &k_variants[k_gpu[k]], &cuda[k]);
    check_result(host_swap.name, &host_swap, &host_swapped);
    compare("cuda: preempt (device swaps) vs preempt host-swap", &cuda[1], &host_swapped, MATCH_BITWISE);
    for (int k = 1; k < 5; k++) {
        char what[96];
        snprintf(what, sizeof what, "cuda tp %d: base vs %s", g_size, k_variants[k_gpu[k]].name);
        /* cuBLASLt picks its algorithm by shape, so only the same schedule is the same math */
        compare(what, &cuda[0], &cuda[k], k_gpu[k] == 2 ? MATCH_BITWISE : MATCH_MARGIN);
    }
    compare("cuda tp 1 vs cuda tp n (base)", &cuda1, &cuda[0], MATCH_MARGIN);
    compare("cpu tp 1 vs cuda tp n (base)", &cpu1, &cuda[0], MATCH_MARGIN);
    ssm_bf16_vs_fp32(path, GDP_BACKEND_CUDA, g_size > 1 ? &cuda1 : &cuda[0]);
}

int main(int argc, char **argv) {
    const bool units = argc > 1 && !strcmp(argv[1], "--units");
    g_cuda = argc > 2 && !strcmp(argv[1], "--backend") && !strcmp(argv[2], "cuda");
    if (units) {
        const long job = (long)getpid();
        units_workload(job);
        units_buckets();
        units_model(job);
        return test_finish("test_engine_units");
    }
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (g_cuda) {
        /* Every rank skips, or none: a rank alone would leave the others in a collective. */
        char why[160] = "";
        int gpus = 0;
        const int usable = test_gpu_usable(why, sizeof why, &gpus);
        if (!test_gpu_all_ranks_usable(usable, "test_engine --backend cuda", why)) {
            MPI_Finalize();
            return TEST_SKIP;
        }
    }
    char path[512];
    long job = (long)getpid();
    MPI_Bcast(&job, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    temp_path(path, sizeof path, "model.safetensors", job);
    gdp_layer_config cfg;
    test_config(&cfg);
    if (g_rank == 0)
        GDP_FATAL_IF_ERROR(NULL, gdp_checkpoint_write_synthetic(path, &cfg, 2026, GDP_DTYPE_FP32));
    MPI_Barrier(MPI_COMM_WORLD);
    make_workloads();
    if (g_rank == 0)
        printf("# engine: D=%lld L=%d H=%lld G=%lld P=%lld N=%lld M=%d vocab %d; %d requests, prompts 5-150, %d new "
               "tokens; %d ranks, %s backend\n",
               (long long)cfg.hidden_size, cfg.num_layers, (long long)cfg.num_heads, (long long)cfg.num_groups,
               (long long)cfg.head_dim, (long long)cfg.state_dim, cfg.num_householder, VOCAB, NREQ, NEW, g_size,
               g_cuda ? "cuda" : "cpu");
    if (g_cuda) {
        gpu_variants(path);
    } else {
        mpi_variants(path);
        mpi_bad_input(path);
        if (g_rank == 0) {
            schedule_order(path);
            ssm_bf16_vs_fp32(path, GDP_BACKEND_CPU, &g_res[0][0]);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0)
        remove(path);
    gdp_workload_free(&g_wl), gdp_workload_free(&g_wl_timed);
    gdp_workload_free(&g_wl_sampled), gdp_workload_free(&g_wl_sampled_timed), gdp_workload_free(&g_wl_stops);
    int failures = 0;
    MPI_Allreduce(&g_test_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("# failures over %d ranks : %d %s\n", g_size, failures, failures ? "FAILED" : "OK");
    if (g_rank == 0 || g_test_failures)
        test_finish(g_cuda ? "test_engine_gpu" : "test_engine");
    MPI_Finalize();
    return failures ? 1 : 0;
}
