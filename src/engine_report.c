/*
 * engine_report.c: what a run reports (engine_internal.h): the progress line, the report's
 * statistics (latency percentiles, phases, the steps' floor), the per-request results and
 * their JSONL, and the printed report with every rank's memory.
 */
#include <sys/resource.h>
#include <unistd.h>

#include <jansson.h>

#include "engine_internal.h"

void eng_progress_line(const struct gdp_engine *e, const run *r, double t, int64_t steps, bool last) {
    const double rate = t > 0 ? (double)r->work_done / t : 0;
    const double eta = rate > 0 ? (double)(r->work_total - r->work_done) / rate : 0;
    int32_t running = 0, waiting = 0;
    for (int32_t i = 0; i < r->n; i++) {
        running += r->r[i].state == RQ_DECODE || r->r[i].state == RQ_PREFILL || r->r[i].state == RQ_ENDING;
        waiting += r->r[i].state == RQ_QUEUED || r->r[i].state == RQ_SWAPPED;
    }
    const bool tty = isatty(fileno(stderr));
    fprintf(stderr, "%s[gdp-run] %6.1f s  step %lld  requests %d/%d done, %d running, %d waiting  %.0f tok/s  ETA %.1f s%s",
            tty ? "\r" : "", t, (long long)steps, r->n_done, r->n, running, waiting, rate, last ? 0.0 : eta,
            tty && !last ? "   " : "\n");
    fflush(stderr);
    (void)e;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of n sorted values. */
static double percentile(const double *v, int64_t n, double p) {
    if (n <= 0)
        return 0;
    int64_t k = (int64_t)ceil(p / 100.0 * (double)n) - 1;
    k = k < 0 ? 0 : k >= n ? n - 1 : k;
    return v[k];
}

void eng_finish_report(struct gdp_engine *e, const run *r, double wall) {
    gdp_engine_report *rep = &e->report;
    rep->wall_s = wall;
    rep->requests = r->n_done;
    rep->prompt_tokens = rep->generated_tokens = 0;
    double *ttft = calloc((size_t)r->n + 1, sizeof(double)), *tpot = calloc((size_t)r->n + 1, sizeof(double));
    int64_t n_tpot = 0;
    for (int32_t i = 0; i < r->n; i++) {
        const rq *q = &r->r[i];
        rep->prompt_tokens += q->spec->prompt_len;
        rep->generated_tokens += q->n_gen;
        if (ttft != NULL)
            ttft[i] = q->first_token - q->arrival;
        if (tpot != NULL && q->n_gen > 1)
            tpot[n_tpot++] = (q->last_token_s - q->first_token) / (q->n_gen - 1);
    }
    if (ttft != NULL && tpot != NULL) {
        qsort(ttft, (size_t)r->n, sizeof(double), cmp_double);
        qsort(tpot, (size_t)n_tpot, sizeof(double), cmp_double);
        qsort(r->itl, (size_t)r->n_itl, sizeof(double), cmp_double);
        rep->ttft_p50_s = percentile(ttft, r->n, 50), rep->ttft_p99_s = percentile(ttft, r->n, 99);
        rep->tpot_p50_s = percentile(tpot, n_tpot, 50), rep->tpot_p99_s = percentile(tpot, n_tpot, 99);
        rep->itl_p50_s = percentile(r->itl, r->n_itl, 50), rep->itl_p99_s = percentile(r->itl, r->n_itl, 99);
    }
    free(ttft);
    free(tpot);
    rep->generated_per_s = wall > 0 ? (double)rep->generated_tokens / wall : 0;
    rep->tokens_per_s = wall > 0 ? (double)(rep->generated_tokens + rep->prompt_tokens) / wall : 0;
    rep->requests_per_s = wall > 0 ? r->n_done / wall : 0;
}
size_t eng_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (size_t)ru.ru_maxrss * 1024u; /* Linux reports kilobytes */
}
gdp_status_t gdp_engine_get_report(gdp_engine_t engine, gdp_engine_report *report) {
    GDP_CHECK(eng_check(engine, "gdp_engine_get_report"));
    if (report == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_engine_get_report: report out-pointer is NULL");
    *report = engine->report;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_engine_get_result(gdp_engine_t engine, int32_t index, gdp_request_result *out) {
    static const char *op = "gdp_engine_get_result";
    GDP_CHECK(eng_check(engine, op));
    if (out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out is NULL", op);
    if (engine->rank != 0 || !engine->have_run)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: results live on the root (rank 0 of the comm) after a successful "
                 "gdp_engine_run; this is rank %d%s", op, engine->rank, engine->have_run ? "" : " (no run yet)");
    const run *r = &engine->main;
    if (index < 0 || index >= r->n)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: index %d is outside [0, %d) (the workload's requests)", op, index,
                 r->n);
    eng_result(engine, r, index, out);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_engine_write_results(gdp_engine_t engine, const char *path) {
    static const char *op = "gdp_engine_write_results";
    GDP_CHECK(eng_check(engine, op));
    if (path == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: path is NULL", op);
    if (engine->rank != 0 || !engine->have_run)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: results live on the root after a successful gdp_engine_run", op);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "%s: cannot write %s", op, path);
    const run *r = &engine->main;
    int bad = 0;
    for (int32_t i = 0; i < r->n && !bad; i++) {
        const rq *q = &r->r[i];
        json_t *toks = json_array();
        for (int32_t k = 0; k < q->n_gen; k++)
            json_array_append_new(toks, json_integer(q->tokens[q->spec->prompt_len + k]));
        static const char *reasons[] = {"length", "stop", "error"};
        json_t *o = json_pack("{s:I, s:i, s:o, s:f, s:f, s:i, s:s}", "id", (json_int_t)q->spec->id, "prompt_len",
                              q->spec->prompt_len, "tokens", toks, "ttft_s", q->first_token - q->arrival,
                              "latency_s", q->finish - q->arrival, "preemptions", q->preemptions, "finish",
                              reasons[q->finish_reason >= 0 && q->finish_reason <= 2 ? q->finish_reason : 2]);
        if (o != NULL && q->finish_reason == GDP_FINISH_ERROR)
            json_object_set_new(o, "error", json_string(q->error));
        bad = o == NULL || json_dumpf(o, f, JSON_COMPACT) != 0 || fputc('\n', f) == EOF;
        json_decref(o);
    }
    bad |= fclose(f) != 0;
    if (bad)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "%s: writing %s failed", op, path);
    return GDP_STATUS_SUCCESS;
}
/* ---- the report ------------------------------------------------------------------------- */

typedef struct rank_memory {
    uint64_t weight, cache, swap, rss, device;
    char     host[64];
} rank_memory;

static void mb(char *buf, size_t n, uint64_t bytes) { snprintf(buf, n, "%.1f MB", (double)bytes / (1 << 20)); }

gdp_status_t gdp_engine_print_report(gdp_engine_t engine, FILE *out, const char *title) {
    static const char *op = "gdp_engine_print_report";
    GDP_CHECK(eng_check(engine, op));
    const struct gdp_engine *e = engine;
    const gdp_engine_report *r = &e->report;
    rank_memory *mem = gdp_calloc((size_t)e->size, sizeof *mem, "the per-rank memory table");
    gdp_status_t st = mem ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    if (e->comm != NULL)
        st = gdp_comm_agree(e->comm, st);
    if (st != GDP_STATUS_SUCCESS) {
        free(mem);
        return st;
    }
    for (int32_t k = 0; k < e->size; k++) {
        rank_memory me = {.weight = r->weight_bytes, .cache = r->cache_bytes, .swap = r->swap_peak_bytes,
                          .rss = r->peak_rss_bytes, .device = r->device_bytes};
        gethostname(me.host, sizeof me.host - 1);
        if (k == e->rank)
            mem[k] = me;
        if (e->comm != NULL)
            GDP_CHECK(gdp_comm_host_bcast(e->comm, &mem[k], sizeof mem[k], k));
    }
    if (e->rank != 0 || out == NULL) {
        free(mem);
        return GDP_STATUS_SUCCESS;
    }
    const gdp_engine_config *c = &e->cfg;
    fprintf(out, "# gdp-run report\n");
    if (title != NULL)
        fprintf(out, "%s", title);
    char prefill[64];
    if (c->prefill_chunk)
        snprintf(prefill, sizeof prefill, "in slices of %d tokens", c->prefill_chunk);
    else
        snprintf(prefill, sizeof prefill, "of whole prompts");
    fprintf(out, "#   engine   : %d slots, step budget %d tokens, prefill %s, cuda graphs %s, %s ssm state\n",
            c->n_slots, c->max_step_tokens, prefill,
            c->cuda_graphs ? (e->graphs_live ? "on" : "on (hooks only)") : "off", gdp_dtype_name(c->ssm_dtype));
    if (c->draft_tokens)
        fprintf(out, "#   drafts   : up to %d per step from %d..2-gram prompt lookup\n", c->draft_tokens, c->ngram);
    else
        fprintf(out, "#   drafts   : off\n");
    if (c->preempt)
        fprintf(out, "#   preempt  : for a request that waited %d ms for a slot, of one that ran %d decode steps; "
                "slot state swapped to %s memory and back%s\n", c->preempt_wait_ms, c->preempt_after,
                e->ctx->backend == GDP_BACKEND_CUDA && c->swap_on_device ? "device" : "host",
                e->swap_host_fallbacks > 0 ? " (some to host memory: the device had no room left)" : "");
    else
        fprintf(out, "#   preempt  : off\n");
    fprintf(out, "%-22s %d\n", "requests", r->requests);
    fprintf(out, "%-22s %lld\n", "prompt tokens", (long long)r->prompt_tokens);
    fprintf(out, "%-22s %lld\n", "generated tokens", (long long)r->generated_tokens);
    fprintf(out, "%-22s %.3f s (idle waiting for arrivals %.3f s)\n", "wall time", r->wall_s, r->idle_s);
    fprintf(out, "%-22s %.1f generated tok/s, %.1f total tok/s, %.2f req/s\n", "throughput", r->generated_per_s,
            r->tokens_per_s, r->requests_per_s);
    fprintf(out, "%-22s p50 %8.2f ms   p99 %8.2f ms\n", "time to first token", r->ttft_p50_s * 1e3,
            r->ttft_p99_s * 1e3);
    fprintf(out, "%-22s p50 %8.2f ms   p99 %8.2f ms\n", "time per output token", r->tpot_p50_s * 1e3,
            r->tpot_p99_s * 1e3);
    fprintf(out, "%-22s p50 %8.2f ms   p99 %8.2f ms\n", "inter-token latency", r->itl_p50_s * 1e3,
            r->itl_p99_s * 1e3);
    fprintf(out, "%-22s %lld (decode-only %lld, mixed %lld, prefill-only %lld), %d step shapes (buckets)\n", "steps",
            (long long)r->steps, (long long)r->decode_only_steps, (long long)r->mixed_steps,
            (long long)r->prefill_only_steps, r->buckets_used);
    fprintf(out, "%-22s %lld (resumed %lld)\n", "preemptions", (long long)r->preemptions, (long long)r->resumes);
    if (c->draft_tokens)
        fprintf(out, "%-22s proposed %lld, accepted %lld (%.1f%%)\n", "draft tokens", (long long)r->drafts_proposed,
                (long long)r->drafts_accepted,
                r->drafts_proposed ? 100.0 * (double)r->drafts_accepted / (double)r->drafts_proposed : 0.0);
    if (e->graphs_live && r->graphs_at_init > 0)
        fprintf(out, "%-22s %d shapes captured at init (%.2f s), %lld captured in the run, %lld replays\n",
                "graphs (step shapes)", r->graphs_at_init, r->graphs_init_s, (long long)r->graph_captures,
                (long long)r->graph_replays);
    else if (e->graphs_live)
        fprintf(out, "%-22s %lld captured, %lld replays\n", "graphs (step shapes)", (long long)r->graph_captures,
                (long long)r->graph_replays);
    else /* CPU backend or MPI comm: the bucket hooks run, no CUDA graph is captured */
        fprintf(out, "%-22s none captured (%s); bucket hooks: %lld first uses, %lld repeats\n",
                "graphs (step shapes)", c->cuda_graphs ? "not on this backend/comm" : "off",
                (long long)r->graph_captures, (long long)r->graph_replays);
    fprintf(out, "step time by phase (rank 0, summed over %lld steps; device phases measured with %s):\n",
            (long long)r->steps, e->ctx->backend == GDP_BACKEND_CUDA ? "CUDA events on the stream" : "clocks");
    for (int p = 0; p < GDP_PHASE_NUM; p++)
        fprintf(out, "  %-20s %9.3f s  %5.1f%%\n", gdp_engine_phase_name((gdp_engine_phase_t)p), r->phase_s[p],
                r->step_s > 0 ? 100.0 * r->phase_s[p] / r->step_s : 0.0);
    fprintf(out, "  %-20s %9.3f s\n", "total", r->step_s);
    fprintf(out, "%-22s %.3f s for %.2f GB and %.2f TFLOP (at %.2f TB/s, %.0f TFLOP/s); device time %.3f s "
                 "(%.0f%% of it at the floor), wall %.3f s (%.0f%%)\n", "floor of the steps", r->floor_s,
            r->floor_bytes * 1e-9, r->floor_flops * 1e-12, GDP_FLOOR_BANDWIDTH * 1e-12, GDP_FLOOR_PEAK * 1e-12,
            r->device_s, r->device_s > 0 ? 100.0 * r->floor_s / r->device_s : 0.0, r->step_s,
            r->step_s > 0 ? 100.0 * r->floor_s / r->step_s : 0.0);
    fprintf(out, "memory per rank:\n  %-5s %-20s %12s %12s %12s %12s %12s\n", "rank", "host", "weights", "cache",
            "swap (peak)", "peak RSS", "device used");
    for (int32_t k = 0; k < e->size; k++) {
        char w[32], ca[32], sw[32], rs[32], dv[32];
        mb(w, sizeof w, mem[k].weight), mb(ca, sizeof ca, mem[k].cache), mb(sw, sizeof sw, mem[k].swap);
        mb(rs, sizeof rs, mem[k].rss);
        if (mem[k].device)
            mb(dv, sizeof dv, mem[k].device);
        else
            snprintf(dv, sizeof dv, "-");
        fprintf(out, "  %-5d %-20.20s %12s %12s %12s %12s %12s\n", k, mem[k].host, w, ca, sw, rs, dv);
    }
    fflush(out);
    free(mem);
    return GDP_STATUS_SUCCESS;
}
