/*
 * test_workload.c: the workload readers' limits, request defaults and sampling fields
 * (include/gdp/workload.h), one process:
 *   - JSONL sampling fields ("temperature", "top_k", "top_p", "seed", "stop") parsed and
 *     validated; fields a line omits come from the request defaults; a request without its
 *     own seed gets gdp_request_seed(defaults seed, id), the same whatever the line order;
 *   - the synthetic generator gives every request the defaults (seed mixed with the id);
 *   - limits (requests, prompt length, new tokens, arrival horizon): a value past one fails
 *     naming the value, the limit and the gdp-run option, before the prompt is allocated
 *     (prompt_len 2^31 - 1 would be 8 GB); raised limits accept it; arrivals of 1e9 s,
 *     1e300 s and a synthetic rate of 1e-9/s fail clearly;
 *   - a NUL byte inside a line is refused (it used to drop the rest of the line);
 *   - a duplicate id names both lines and says when the id was the default index.
 * Every refused load leaves *out untouched.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gdp/workload.h"
#include "test_common.h"

#define VOCAB 128

static char g_path[256];

static void write_bytes(const char *text, size_t n) {
    FILE *f = fopen(g_path, "wb");
    fwrite(text, 1, n, f);
    fclose(f);
}

static void write_text(const char *text) { write_bytes(text, strlen(text)); }

static gdp_status_t load(gdp_workload *wl, const gdp_workload_limits *lim, const gdp_request_defaults *d) {
    return gdp_workload_load_jsonl_ex(wl, g_path, VOCAB, 3, lim, d);
}

/* The file (text) must fail with INVALID_ARGUMENT and a message holding each needle. */
static void expect_error(const char *what, const char *text, const gdp_workload_limits *lim,
                         const gdp_request_defaults *d, const char *n1, const char *n2, const char *n3) {
    write_text(text);
    gdp_workload wl = {.n_requests = -7};
    gdp_status_t st = load(&wl, lim, d);
    const char *msg = gdp_last_error();
    CHECK(st == GDP_STATUS_INVALID_ARGUMENT, "%s: returned %d: %s", what, (int)st, msg);
    const char *needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i] != NULL)
            CHECK(strstr(msg, needles[i]) != NULL, "%s: the message lacks \"%s\": %s", what, needles[i], msg);
    CHECK(wl.n_requests == -7 && wl.requests == NULL, "%s: a failed load modified *out", what);
}

static const gdp_request_spec *by_id(const gdp_workload *wl, int64_t id) {
    for (int32_t i = 0; i < wl->n_requests; i++)
        if (wl->requests[i].id == id)
            return &wl->requests[i];
    return NULL;
}

static void sampling_fields(void) {
    /* No defaults given: greedy, seed mixed from 0, no stop tokens. */
    write_text("{\"id\": 5, \"prompt\": [1, 2], \"max_new_tokens\": 3}\n"
               "{\"id\": 6, \"prompt\": [3], \"max_new_tokens\": 2, \"temperature\": 0.7, \"top_k\": 40, "
               "\"top_p\": 0.9, \"seed\": 12345, \"stop\": [7, 0, 127]}\n");
    gdp_workload wl;
    CHECK_OK(load(&wl, NULL, NULL));
    const gdp_request_spec *a = by_id(&wl, 5), *b = by_id(&wl, 6);
    CHECK(a && a->sampling.temperature == 0 && a->sampling.top_k == 0 && a->sampling.top_p == 1 &&
              a->sampling.seed == gdp_request_seed(0, 5) && a->n_stop == 0,
          "request 5 should have the default sampling (greedy, seed mixed from 0, no stop)");
    CHECK(b && b->sampling.temperature == 0.7f && b->sampling.top_k == 40 && b->sampling.top_p == 0.9f &&
              b->sampling.seed == 12345 && b->n_stop == 3 && b->stop[0] == 7 && b->stop[1] == 0 && b->stop[2] == 127,
          "request 6's sampling fields parsed wrong");
    gdp_workload_free(&wl);
    /* The old wrapper reads the same fields. */
    CHECK_OK(gdp_workload_load_jsonl(&wl, g_path, VOCAB, 3));
    CHECK(wl.n_requests == 2 && by_id(&wl, 6) && by_id(&wl, 6)->sampling.top_k == 40, "the wrapper differs");
    gdp_workload_free(&wl);

    /* Defaults for what a line omits; a line's own values win ("stop": [] clears them). */
    gdp_request_defaults d = gdp_request_defaults_default();
    d.sampling.temperature = 1.0f, d.sampling.top_p = 0.95f, d.sampling.seed = 77;
    d.n_stop = 2, d.stop[0] = 4, d.stop[1] = 9;
    write_text("{\"prompt\": [1], \"max_new_tokens\": 1}\n"
               "{\"prompt\": [1], \"max_new_tokens\": 1, \"temperature\": 0, \"stop\": []}\n"
               "{\"prompt\": [1], \"max_new_tokens\": 1, \"seed\": 0, \"top_k\": 3, \"stop\": [11]}\n");
    CHECK_OK(load(&wl, NULL, &d));
    a = by_id(&wl, 0), b = by_id(&wl, 1);
    const gdp_request_spec *c = by_id(&wl, 2);
    CHECK(a && a->sampling.temperature == 1.0f && a->sampling.top_p == 0.95f && a->sampling.top_k == 0 &&
              a->sampling.seed == gdp_request_seed(77, 0) && a->n_stop == 2 && a->stop[0] == 4 && a->stop[1] == 9,
          "request 0 should have every default");
    CHECK(b && b->sampling.temperature == 0 && b->sampling.top_p == 0.95f && b->n_stop == 0 &&
              b->sampling.seed == gdp_request_seed(77, 1),
          "request 1: its temperature and empty stop list, the rest default");
    CHECK(c && c->sampling.seed == 0 && c->sampling.top_k == 3 && c->n_stop == 1 && c->stop[0] == 11,
          "request 2: its own seed 0, top_k 3, stop [11]");
    CHECK(a && b && a->sampling.seed != b->sampling.seed, "requests 0 and 1 got the same mixed seed");
    gdp_workload_free(&wl);

    /* The mixed seed depends on the id only, not on the order of the lines. */
    write_text("{\"id\": 30, \"prompt\": [1], \"max_new_tokens\": 1}\n{\"id\": 31, \"prompt\": [1], \"max_new_tokens\": 1}\n");
    gdp_workload w1, w2;
    CHECK_OK(load(&w1, NULL, &d));
    write_text("{\"id\": 31, \"prompt\": [1], \"max_new_tokens\": 1}\n{\"id\": 30, \"prompt\": [1], \"max_new_tokens\": 1}\n");
    CHECK_OK(load(&w2, NULL, &d));
    CHECK(by_id(&w1, 30) && by_id(&w2, 30) && by_id(&w1, 31) && by_id(&w2, 31) &&
              by_id(&w1, 30)->sampling.seed == by_id(&w2, 30)->sampling.seed &&
              by_id(&w1, 31)->sampling.seed == by_id(&w2, 31)->sampling.seed &&
              by_id(&w1, 30)->sampling.seed != by_id(&w1, 31)->sampling.seed,
          "the seeds of ids 30 and 31 depend on the line order");
    gdp_workload_free(&w1), gdp_workload_free(&w2);
    CHECK(gdp_request_seed(77, 30) != gdp_request_seed(78, 30) && gdp_request_seed(77, 30) != gdp_request_seed(77, 31),
          "gdp_request_seed ignores its base seed or the id");

    /* Refused values, each naming the line and field. */
    const struct {
        const char *line, *n1, *n2;
    } bad[] = {
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"temperature\": -1}", "temperature", ":1:"},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"temperature\": 1e300}", "temperature", "finite"},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"temperature\": \"hot\"}", "\"temperature\" must be a number", NULL},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"top_k\": 2000}", "top_k", "1024"},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"top_k\": -1}", "top_k", NULL},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"top_k\": 1.5}", "\"top_k\" must be an integer", NULL},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"top_p\": -0.5}", "top_p", ":1:"},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"top_k\": 1e3}", "\"top_k\" must be an integer", NULL},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"top_k\": 99999999999}", "top_k", NULL},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"top_p\": 1.5}", "top_p", NULL},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"seed\": -1}", "seed", ">= 0"},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"seed\": 0.5}", "\"seed\" must be an integer", NULL},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"stop\": 4}", "\"stop\" must be an array", NULL},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"stop\": [1, 128]}", "stop[1]", "[0, 128)"},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"stop\": [\"x\"]}", "stop[0]", NULL},
        {"{\"prompt\": [1], \"max_new_tokens\": 1, \"stop\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "17 token ids",
         "at most 16"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "%s\n", bad[i].line);
        expect_error(bad[i].line, text, NULL, NULL, bad[i].n1, bad[i].n2, NULL);
    }

    /* Bad defaults are refused before the file is read. */
    const char *one = "{\"prompt\": [1], \"max_new_tokens\": 1}\n";
    gdp_request_defaults bd = gdp_request_defaults_default();
    bd.sampling.temperature = NAN;
    expect_error("NaN default temperature", one, NULL, &bd, "request defaults", "temperature", NULL);
    bd = gdp_request_defaults_default();
    bd.n_stop = 1, bd.stop[0] = VOCAB;
    expect_error("default stop outside the vocabulary", one, NULL, &bd, "request defaults", "stop[0] = 128", NULL);
    bd.n_stop = GDP_MAX_STOP_TOKENS + 1;
    expect_error("too many default stops", one, NULL, &bd, "request defaults", "17 stop tokens", NULL);
}

static void synthetic_defaults(void) {
    gdp_synthetic_workload p;
    CHECK_OK(gdp_workload_synthetic_default(&p));
    p.n_requests = 5, p.prompt_min = 4, p.prompt_max = 8;
    gdp_request_defaults d = gdp_request_defaults_default();
    d.sampling.temperature = 0.5f, d.sampling.top_k = 8, d.sampling.seed = 99, d.n_stop = 1, d.stop[0] = 3;
    gdp_workload wl;
    CHECK_OK(gdp_workload_synthetic_ex(&wl, &p, VOCAB, NULL, &d));
    bool ok = wl.n_requests == 5;
    for (int32_t i = 0; ok && i < wl.n_requests; i++) {
        const gdp_request_spec *q = &wl.requests[i];
        ok &= q->sampling.temperature == 0.5f && q->sampling.top_k == 8 && q->sampling.top_p == 1 &&
              q->sampling.seed == gdp_request_seed(99, q->id) && q->n_stop == 1 && q->stop[0] == 3;
    }
    CHECK(ok, "the synthetic workload did not give every request the defaults with a mixed seed");
    gdp_workload_free(&wl);
    /* The plain generator: greedy defaults, seeds mixed from 0. */
    CHECK_OK(gdp_workload_synthetic(&wl, &p, VOCAB));
    CHECK(wl.n_requests == 5 && wl.requests[2].sampling.temperature == 0 &&
              wl.requests[2].sampling.seed == gdp_request_seed(0, wl.requests[2].id) && wl.requests[2].n_stop == 0,
          "the plain synthetic generator's requests lack the default sampling");
    gdp_workload_free(&wl);
    d.stop[0] = VOCAB;
    gdp_workload untouched = {.n_requests = -3};
    CHECK_STATUS(gdp_workload_synthetic_ex(&untouched, &p, VOCAB, NULL, &d), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(untouched.n_requests == -3, "a refused synthetic workload modified *out");
}

static void limits(void) {
    const gdp_workload_limits dl = gdp_workload_limits_default();
    CHECK(dl.max_requests == GDP_WORKLOAD_DEFAULT_MAX_REQUESTS && dl.max_prompt_len == GDP_WORKLOAD_DEFAULT_MAX_PROMPT_LEN &&
              dl.max_new_tokens == GDP_WORKLOAD_DEFAULT_MAX_NEW_TOKENS && dl.max_arrival_s == GDP_WORKLOAD_DEFAULT_MAX_ARRIVAL_S,
          "gdp_workload_limits_default differs from the documented defaults");
    CHECK_OK(gdp_workload_limits_check(&dl));
    gdp_workload_limits bad = dl;
    bad.max_arrival_s = NAN;
    CHECK_STATUS(gdp_workload_limits_check(&bad), GDP_STATUS_INVALID_ARGUMENT);
    bad = dl, bad.max_prompt_len = 0;
    CHECK_STATUS(gdp_workload_limits_check(&bad), GDP_STATUS_INVALID_ARGUMENT);
    expect_error("bad limits", "{\"prompt\": [1], \"max_new_tokens\": 1}\n", &bad, NULL, "max_prompt_len = 0", NULL,
                 NULL);

    /* Past the default limits, failing before the prompt is allocated (2^31 - 1 tokens would
     * take 8 GB), with the value, the limit and the option. */
    expect_error("prompt_len 2^31 - 1", "{\"prompt_len\": 2147483647, \"max_new_tokens\": 1}\n", NULL, NULL,
                 "2147483647", "1048576", "--max-prompt-len");
    expect_error("max_new_tokens 2^31 - 1", "{\"prompt\": [1], \"max_new_tokens\": 2147483647}\n", NULL, NULL,
                 "2147483647", "1048576", "--max-new-tokens");
    expect_error("max_new_tokens 2^40", "{\"prompt\": [1], \"max_new_tokens\": 1099511627776}\n", NULL, NULL,
                 "1099511627776", "--max-new-tokens", NULL);
    expect_error("arrival 1e9 s", "{\"prompt\": [1], \"max_new_tokens\": 1}\n{\"prompt\": [1], \"max_new_tokens\": 1, "
                 "\"arrival\": 1e9}\n", NULL, NULL, ":2:", "horizon of 86400 s", "--max-arrival");
    expect_error("arrival 1e300 s", "{\"prompt\": [1], \"max_new_tokens\": 1, \"arrival\": 1e300}\n", NULL, NULL,
                 "1e+300", "horizon", NULL);

    /* Tight limits: at the limit passes, one past fails. */
    gdp_workload_limits tight = {.max_requests = 2, .max_prompt_len = 3, .max_new_tokens = 4, .max_arrival_s = 10};
    write_text("{\"prompt\": [1, 2, 3], \"max_new_tokens\": 4, \"arrival\": 10}\n{\"prompt_len\": 3, \"max_new_tokens\": 1}\n");
    gdp_workload wl;
    CHECK_OK(load(&wl, &tight, NULL));
    gdp_workload_free(&wl);
    expect_error("3 requests, limit 2", "{\"prompt\": [1], \"max_new_tokens\": 1}\n\n# c\n{\"prompt\": [1], "
                 "\"max_new_tokens\": 1}\n{\"prompt\": [1], \"max_new_tokens\": 1}\n", &tight, NULL, ":5:",
                 "more than 2 requests", "--max-requests");
    expect_error("prompt of 4, limit 3", "{\"prompt\": [1, 2, 3, 4], \"max_new_tokens\": 1}\n", &tight, NULL,
                 "prompt length 4", "limit of 3", NULL);
    expect_error("5 new tokens, limit 4", "{\"prompt\": [1], \"max_new_tokens\": 5}\n", &tight, NULL, "= 5",
                 "limit of 4", NULL);
    expect_error("arrival 10.5, horizon 10", "{\"prompt\": [1], \"max_new_tokens\": 1, \"arrival\": 10.5}\n", &tight,
                 NULL, "10.5", "horizon of 10 s", NULL);
    /* Raised limits accept what the defaults refuse. */
    gdp_workload_limits wide = dl;
    wide.max_arrival_s = 2e9, wide.max_new_tokens = INT32_MAX;
    write_text("{\"prompt\": [1], \"max_new_tokens\": 2147483647, \"arrival\": 1e9}\n");
    CHECK_OK(load(&wl, &wide, NULL));
    CHECK(wl.n_requests == 1 && wl.requests[0].arrival_s == 1e9 && wl.requests[0].max_new_tokens == INT32_MAX,
          "the raised limits did not take the request as given");
    gdp_workload_free(&wl);

    /* Synthetic: a rate so small the arrivals run past the horizon, and the size limits. */
    gdp_synthetic_workload p;
    CHECK_OK(gdp_workload_synthetic_default(&p));
    p.n_requests = 4;
    const double rates[3] = {1e-9, 1e-300, 4.9e-324};
    for (int i = 0; i < 3; i++) {
        p.rate = rates[i];
        gdp_workload w = {.n_requests = -5};
        CHECK_STATUS(gdp_workload_synthetic_ex(&w, &p, VOCAB, NULL, NULL), GDP_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(gdp_last_error(), "past the arrival horizon") && strstr(gdp_last_error(), "--max-arrival") &&
                  w.n_requests == -5,
              "synthetic rate %g: %s", rates[i], gdp_last_error());
    }
    p.rate = 1e-3; /* 4 requests over ~4000 s: inside the default horizon of a day */
    CHECK_OK(gdp_workload_synthetic_ex(&wl, &p, VOCAB, NULL, NULL));
    gdp_workload_free(&wl);
    p.rate = 0;
    p.n_requests = 3;
    gdp_workload w = {.n_requests = -5};
    CHECK_STATUS(gdp_workload_synthetic_ex(&w, &p, VOCAB, &tight, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "n = 3 requests exceeds the limit of 2"), "synthetic n: %s", gdp_last_error());
    tight.max_requests = 10;
    CHECK_STATUS(gdp_workload_synthetic_ex(&w, &p, VOCAB, &tight, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "--max-prompt-len"), "synthetic prompt: %s", gdp_last_error());
    p.prompt_min = 1, p.prompt_max = 3;
    CHECK_STATUS(gdp_workload_synthetic_ex(&w, &p, VOCAB, &tight, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "--max-new-tokens"), "synthetic new tokens: %s", gdp_last_error());
    CHECK(w.n_requests == -5, "a refused synthetic workload modified *out");
}

static void messages(void) {
    /* A NUL byte: the line must not be read as ending there. */
    const char nul_line[] = "{\"prompt\": [1], \"max_new_tokens\": 1}\n{\"prompt\": [1],\0 \"max_new_tokens\": 1}\n";
    write_bytes(nul_line, sizeof nul_line - 1);
    gdp_workload wl = {.n_requests = -7};
    CHECK_STATUS(load(&wl, NULL, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), ":2:") && strstr(gdp_last_error(), "NUL byte at column 16"), "NUL: %s",
          gdp_last_error());
    CHECK(wl.n_requests == -7, "a failed load modified *out");
    /* A line that ends right after the NUL still fails (once parsed as '{...}' plus nothing). */
    const char nul_tail[] = "{\"prompt\": [1], \"max_new_tokens\": 1}\0garbage\n";
    write_bytes(nul_tail, sizeof nul_tail - 1);
    CHECK_STATUS(load(&wl, NULL, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "NUL byte at column 37"), "NUL tail: %s", gdp_last_error());

    /* A default id colliding with an explicit one: both lines named, the default said so. */
    expect_error("default id collides", "{\"id\": 1, \"prompt\": [1], \"max_new_tokens\": 1}\n"
                 "# a comment\n{\"prompt\": [2], \"max_new_tokens\": 1}\n", NULL, NULL, "id 1 is used twice",
                 "by line 1 and by line 3 (no \"id\": the default, its request index)", ":3:");
    expect_error("explicit ids collide", "{\"id\": 4, \"prompt\": [1], \"max_new_tokens\": 1}\n"
                 "{\"id\": 8, \"prompt\": [1], \"max_new_tokens\": 1}\n{\"id\": 8, \"prompt\": [1], \"max_new_tokens\": 1}\n"
                 "{\"id\": 4, \"prompt\": [1], \"max_new_tokens\": 1}\n", NULL, NULL, "id 8 is used twice",
                 "by line 2 and by line 3;", NULL);
}

/* Many requests in arrival order that is the reverse of the file: sorted stably, quickly. */
static void large(void) {
    const int n = 50000;
    FILE *f = fopen(g_path, "w");
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"prompt\": [%d], \"max_new_tokens\": 1, \"arrival\": %d}\n", i % VOCAB, (n - i) / 2);
    fclose(f);
    gdp_workload wl;
    CHECK_OK(load(&wl, NULL, NULL));
    bool ok = wl.n_requests == n;
    for (int32_t i = 1; ok && i < wl.n_requests; i++)
        ok = wl.requests[i - 1].arrival_s < wl.requests[i].arrival_s ||
             (wl.requests[i - 1].arrival_s == wl.requests[i].arrival_s && wl.requests[i - 1].id < wl.requests[i].id);
    CHECK(ok, "%d requests not sorted stably by arrival", n);
    gdp_workload_free(&wl);
}

int main(void) {
    snprintf(g_path, sizeof g_path, "%s/gdp_test_workload_%d.jsonl", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    sampling_fields();
    synthetic_defaults();
    limits();
    messages();
    large();
    unlink(g_path);
    return test_finish("test_workload");
}
