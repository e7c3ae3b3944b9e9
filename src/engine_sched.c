/*
 * engine_sched.c: the root's scheduling (engine_internal.h): the run state of a workload,
 * the step buckets, the n-gram drafter, and compose: arrivals, releases, the preemption
 * policy, resumes, decode rows with drafts, prefill slices under the token budget, the
 * bucket, and the rows the head samples with their sampling parameters.
 *
 * Reproducibility is a design rule here: a request's tokens must not depend on the rest
 * of the batch (gdp-math.md 8.1: identical with and without preemption or graphs). So
 *   - prefill slices have a fixed length (prefill_chunk; slice starts at 64-token
 *     boundaries of the prompt) and a slice either fits a step or waits: the budget never
 *     shortens a slice, since the chunked op's summation depends on where slices start;
 *   - every GEMM has at least 2 rows (buckets; the LM head runs in fixed row blocks);
 *   - preemption copies the slot's exact state out and back (no recompute);
 *   - a sampled draw depends only on the request's seed, the token's position and its
 *     logits (sampling.h), never on the row it sits in.
 */
#include "engine_internal.h"

/* ---- buckets -------------------------------------------------------------------------------- */

static int32_t level_at_least(const int32_t *levels, int32_t n, int32_t v) {
    for (int32_t i = 0; i < n; i++)
        if (levels[i] >= v)
            return i;
    return -1;
}

/* The prefill request entries of the buckets at prefill-token level pt (top: the largest level).
 * Every step of a bucket has that many (padding ones are empty), and each costs a layer its
 * initial state's gather (the state's bytes: 1 MB at H 16, 128 x 128, fp32, zeros for a padding
 * entry) and a head row, so a level takes one entry per GDP_CHUNK_SIZE tokens, at least
 * ENG_MIN_PREFILL_ENTRIES, at most max_prefill; the top level (the budget's second copy, where
 * there is one) takes max_prefill, so every step has a bucket (eng_bucket_for moves a step with
 * more slices than its level's entries up a level). */
enum { ENG_MIN_PREFILL_ENTRIES = 4 };
static int32_t prefill_entries(const struct gdp_engine *e, int32_t pt, bool top) {
    if (pt == 0)
        return 0;
    int32_t n = top ? e->max_prefill : pt / GDP_CHUNK_SIZE;
    if (n < ENG_MIN_PREFILL_ENTRIES)
        n = ENG_MIN_PREFILL_ENTRIES;
    return n < e->max_prefill ? n : e->max_prefill;
}

/* Buckets for S = 1 and S = S_max: decode counts 0, 1, 2, 4 .. n_slots x prefill tokens
 * 0, 64, 128, 256 .. budget (the budget twice: its own entries, then max_prefill); rows = max(2, decode * S + prefill) (never a one-row GEMM),
 * with CP at least 2 per CP rank and rounded up to a multiple of cp (equal row blocks);
 * prefill_entries(level) prefill requests. A bucket's head samples decode * S + its prefill
 * requests rows, padded. */
gdp_status_t eng_make_buckets(struct gdp_engine *e) {
    const gdp_engine_config *c = &e->cfg;
    int32_t nd = 0, np = 0;
    e->dec_levels[nd++] = 0;
    for (int32_t d = 1; d < c->n_slots; d *= 2)
        e->dec_levels[nd++] = d;
    e->dec_levels[nd++] = c->n_slots;
    e->pre_levels[np++] = 0;
    for (int32_t p = GDP_CHUNK_SIZE; p < c->max_step_tokens; p *= 2)
        e->pre_levels[np++] = p;
    e->pre_levels[np++] = c->max_step_tokens;
    /* the budget's level once more where its entries (prefill_entries) are fewer than max_prefill:
     * the first copy has those, the last max_prefill, so a full step of a few slices does not pay
     * for max_prefill of them and a step of many short slices still has a bucket */
    if (prefill_entries(e, c->max_step_tokens, false) < e->max_prefill)
        e->pre_levels[np++] = c->max_step_tokens;
    e->n_dec_levels = nd, e->n_pre_levels = np;
    const int32_t n_s = e->S_max > 1 ? 2 : 1;
    e->bucket_of = gdp_calloc((size_t)(n_s * nd * np), sizeof(int32_t), "the engine's bucket table");
    e->buckets = gdp_calloc((size_t)(n_s * nd * np), sizeof *e->buckets, "the engine's buckets");
    e->bucket_S = gdp_calloc((size_t)(n_s * nd * np), sizeof(int32_t), "the engine's bucket S table");
    e->bucket_head = gdp_calloc((size_t)(n_s * nd * np), sizeof(int32_t), "the engine's bucket head table");
    if (e->bucket_of == NULL || e->buckets == NULL || e->bucket_S == NULL || e->bucket_head == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    int32_t n = 0;
    for (int32_t si = 0; si < n_s; si++) {
        const int32_t S = si ? e->S_max : 1;
        for (int32_t di = 0; di < nd; di++)
            for (int32_t pi = 0; pi < np; pi++) {
                const int32_t dc = e->dec_levels[di], pt = e->pre_levels[pi];
                int32_t *slot = &e->bucket_of[(si * nd + di) * np + pi];
                if (dc == 0 && pt == 0) {
                    *slot = -1;
                    continue;
                }
                const int32_t cp = e->cp.cp_size, need = dc * S + pt < 2 * cp ? 2 * cp : dc * S + pt;
                const int32_t rows = (need + cp - 1) / cp * cp;
                const int32_t entries = prefill_entries(e, pt, pi == np - 1);
                /* A decode-only bucket (no CP) has a decode entry for every row (padding ones slot -1):
                 * then every row is a decode row and the layer reads the decode op's output in place
                 * (layer.c y_in_place) instead of zeroing y and gathering it, as at one request in two
                 * rows (the two-row floor above) it otherwise would. At most n_slots entries, the
                 * largest decode level, so that the warm-up's bucket still covers every other. */
                const int32_t dcount = pt == 0 && cp == 1 && rows % S == 0 && rows / S <= c->n_slots ? rows / S : dc;
                e->buckets[n] = (gdp_step_bucket){.decode_count = dcount, .prefill_count = entries, .token_count = rows};
                if (rows > e->max_rows)
                    e->max_rows = rows;
                e->bucket_S[n] = S;
                /* the head samples every decode row and one row per prefill slice */
                e->bucket_head[n] = dcount * S + entries;
                if (e->bucket_head[n] > e->max_head)
                    e->max_head = e->bucket_head[n];
                *slot = n++;
            }
    }
    e->n_buckets = n;
    return GDP_STATUS_SUCCESS;
}

int32_t eng_bucket_for(const struct gdp_engine *e, int32_t S, int32_t n_decode, int32_t prefill_tokens,
                       int32_t n_prefill) {
    const int32_t si = S > 1 ? 1 : 0;
    const int32_t di = level_at_least(e->dec_levels, e->n_dec_levels, n_decode);
    const int32_t pi = level_at_least(e->pre_levels, e->n_pre_levels, prefill_tokens);
    if (di < 0 || pi < 0 || (S > 1 && S != e->S_max))
        return -1;
    /* the smallest prefill level that holds both the tokens and the slices */
    for (int32_t p = pi; p < e->n_pre_levels; p++) {
        const int32_t b = e->bucket_of[(si * e->n_dec_levels + di) * e->n_pre_levels + p];
        if (b >= 0 && e->buckets[b].prefill_count >= n_prefill)
            return b;
    }
    return -1;
}
/* ---- the root's run state ---------------------------------------------------------------- */

/* Every rule a workload must meet, before anything is touched (the root). */
gdp_status_t eng_validate_workload(const struct gdp_engine *e, const gdp_workload *wl, int64_t *total_new) {
    static const char *op = "gdp_engine_run";
    if (wl == NULL || wl->n_requests < 1 || wl->requests == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the root passed %s; pass a workload with at least one request", op,
                 wl == NULL ? "no workload" : "an empty workload");
    const gdp_engine_config *c = &e->cfg;
    *total_new = 0;
    for (int32_t i = 0; i < wl->n_requests; i++) {
        const gdp_request_spec *q = &wl->requests[i];
        if (q->prompt_len < 1 || q->prompt == NULL || q->max_new_tokens < 1 || !(q->arrival_s >= 0))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: request %lld has prompt_len %d, max_new_tokens %d, arrival %g; need >= 1, >= 1, >= 0", op,
                     (long long)q->id, q->prompt_len, q->max_new_tokens, q->arrival_s);
        if ((int64_t)q->prompt_len + q->max_new_tokens + e->S_max > INT32_MAX)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: request %lld: prompt_len %d + max_new_tokens %d exceeds 2^31 - 1 tokens; ask for fewer", op,
                     (long long)q->id, q->prompt_len, q->max_new_tokens);
        char what[96];
        snprintf(what, sizeof what, "%s: request %lld", op, (long long)q->id);
        GDP_CHECK(gdp_sampling_params_check(&q->sampling, what));
        if (q->sampling.top_k > c->max_candidates)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: request %lld asks for top_k %d but the engine keeps %d sampling candidates; raise "
                     "config.max_candidates (gdp-run --max-candidates) to at least %d", op, (long long)q->id,
                     q->sampling.top_k, c->max_candidates, q->sampling.top_k);
        if (q->n_stop < 0 || q->n_stop > GDP_MAX_STOP_TOKENS)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: request %lld has %d stop tokens; give 0 .. %d", op,
                     (long long)q->id, q->n_stop, GDP_MAX_STOP_TOKENS);
        for (int32_t k = 0; k < q->n_stop; k++)
            if (q->stop[k] < 0 || q->stop[k] >= e->vocab)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: request %lld: stop token %d is outside the model's vocabulary [0, %lld)", op,
                         (long long)q->id, q->stop[k], (long long)e->vocab);
        if (c->prefill_chunk == 0 && q->prompt_len > c->max_step_tokens)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: request %lld has a prompt of %d tokens but whole-prompt prefill (prefill_chunk 0) must fit "
                     "one step of max_step_tokens %d; raise the budget or prefill in chunks", op, (long long)q->id,
                     q->prompt_len, c->max_step_tokens);
        for (int32_t t = 0; t < q->prompt_len; t++)
            if (q->prompt[t] < 0 || q->prompt[t] >= e->vocab)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: request %lld: prompt[%d] = %d is outside the model's vocabulary [0, %lld)", op,
                         (long long)q->id, t, q->prompt[t], (long long)e->vocab);
        if (i > 0 && q->arrival_s < wl->requests[i - 1].arrival_s)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: request %lld arrives at %g s, before its predecessor (%g s); sort the workload by arrival", op,
                     (long long)q->id, q->arrival_s, wl->requests[i - 1].arrival_s);
        *total_new += q->max_new_tokens;
    }
    return GDP_STATUS_SUCCESS;
}

/* The root's state of a run over a validated workload. */
gdp_status_t eng_run_init(struct gdp_engine *e, run *r, const gdp_workload *wl, int32_t keep_logits,
                          int first_logits) {
    memset(r, 0, sizeof *r);
    int64_t total_new = 0;
    GDP_CHECK(eng_validate_workload(e, wl, &total_new));
    const gdp_engine_config *c = &e->cfg;
    r->n = wl->n_requests;
    r->r = gdp_calloc((size_t)r->n, sizeof *r->r, "the run's requests");
    r->slot_owner = gdp_calloc((size_t)c->n_slots, sizeof(int32_t), "the run's slot table");
    r->released_now = gdp_calloc((size_t)c->n_slots, 1, "the run's release marks");
    r->release = gdp_calloc((size_t)c->n_slots, sizeof(int32_t), "the run's releases");
    r->free_bufs = gdp_calloc((size_t)r->n, sizeof(int32_t), "the run's swap ids");
    r->itl = gdp_calloc((size_t)total_new, sizeof(double), "the run's token gaps");
    r->keep_logits = keep_logits < r->n ? keep_logits : r->n;
    if (r->keep_logits > 0)
        r->kept_logits = gdp_calloc((size_t)r->keep_logits * (size_t)e->vocab, sizeof(float), "the kept logits");
    if (r->r == NULL || r->slot_owner == NULL || r->released_now == NULL || r->release == NULL ||
        r->free_bufs == NULL || r->itl == NULL || (r->keep_logits > 0 && r->kept_logits == NULL))
        return GDP_STATUS_SYSTEM_ERROR;
    r->first_logits = first_logits;
    for (int32_t s = 0; s < c->n_slots; s++)
        r->slot_owner[s] = -1;
    for (int32_t i = 0; i < r->n; i++) {
        rq *q = &r->r[i];
        q->spec = &wl->requests[i];
        const int32_t cap = q->spec->prompt_len + q->spec->max_new_tokens + e->S_max;
        q->tokens = gdp_calloc((size_t)cap, sizeof(int32_t), "a request's tokens");
        q->margin = gdp_calloc((size_t)q->spec->max_new_tokens, sizeof(float), "a request's margins");
        q->scale = gdp_calloc((size_t)q->spec->max_new_tokens, sizeof(float), "a request's logit scales");
        if (q->tokens == NULL || q->margin == NULL || q->scale == NULL)
            return GDP_STATUS_SYSTEM_ERROR;
        memcpy(q->tokens, q->spec->prompt, sizeof(int32_t) * (size_t)q->spec->prompt_len);
        q->n_tokens = q->spec->prompt_len;
        q->slot = q->swap_buf = -1;
        q->arrival = c->honor_arrivals ? q->spec->arrival_s : 0;
        r->work_total += q->spec->prompt_len + q->spec->max_new_tokens;
    }
    return GDP_STATUS_SUCCESS;
}

void eng_run_free(run *r) {
    for (int32_t i = 0; r->r != NULL && i < r->n; i++) {
        free(r->r[i].tokens);
        free(r->r[i].margin);
        free(r->r[i].scale);
    }
    free(r->r);
    free(r->slot_owner);
    free(r->released_now);
    free(r->release);
    free(r->free_bufs);
    free(r->itl);
    free(r->kept_logits);
    memset(r, 0, sizeof *r);
}

/* ---- the n-gram drafter ------------------------------------------------------------------- */

/* Prompt lookup: the most recent earlier occurrence of the last n tokens (n = nmax .. 2)
 * proposes the up to k tokens that followed it. Returns how many it proposes. */
static int32_t ngram_draft(const int32_t *h, int32_t len, int32_t nmax, int32_t k, int32_t *out) {
    for (int32_t n = nmax < len - 1 ? nmax : len - 1; n >= 2; n--) {
        const int32_t *suffix = h + len - n;
        for (int32_t j = len - n - 1; j >= 0; j--) {
            if (memcmp(h + j, suffix, sizeof(int32_t) * (size_t)n) != 0)
                continue;
            int32_t m = 0;
            while (m < k && j + n + m < len)
                out[m] = h[j + n + m], m++;
            if (m > 0)
                return m;
        }
    }
    return 0;
}
/* ---- one step ------------------------------------------------------------------------------ */


void eng_step_plan_free(step_plan *sp) {
    if (sp == NULL)
        return;
    free(sp->dec_req), free(sp->n_drafts), free(sp->drafts), free(sp->dec_slots), free(sp->releases);
    free(sp->accepts), free(sp->freed_bufs), free(sp->pre_req), free(sp->pre_head), free(sp->prefill);
    free(sp->logit_rows);
    free(sp);
}

step_plan *eng_step_plan_alloc(const struct gdp_engine *e) {
    step_plan *sp = gdp_calloc(1, sizeof *sp, "the step plan scratch");
    if (sp == NULL)
        return NULL;
    const size_t n = (size_t)e->cfg.n_slots, np = (size_t)e->max_prefill;
    sp->dec_req = calloc(n, sizeof(int32_t)), sp->n_drafts = calloc(n, sizeof(int32_t));
    sp->drafts = calloc(n * MAX_DRAFTS, sizeof(int32_t)), sp->dec_slots = calloc(n, sizeof(int32_t));
    sp->releases = calloc(n, sizeof(int32_t)), sp->accepts = calloc(n, sizeof(gdp_draft_accept));
    sp->freed_bufs = calloc(n, sizeof(int32_t)), sp->pre_req = calloc(np, sizeof(int32_t));
    sp->pre_head = calloc(np, sizeof(int32_t)), sp->prefill = calloc(np, sizeof(gdp_prefill_request));
    sp->logit_rows = calloc((size_t)e->max_head, sizeof(int32_t));
    if (!sp->dec_req || !sp->n_drafts || !sp->drafts || !sp->dec_slots || !sp->releases || !sp->accepts ||
        !sp->freed_bufs || !sp->pre_req || !sp->pre_head || !sp->prefill || !sp->logit_rows) {
        eng_step_plan_free(sp);
        gdp_set_error(GDP_STATUS_SYSTEM_ERROR, __FILE__, __LINE__, "engine: out of memory for the step plan");
        return NULL;
    }
    return sp;
}
/* One head row of the frame: the row of x and the draw's parameters (gdp_sample_row). */
static void head_entry(int32_t *w, int32_t row, const gdp_sampling_params *p, int32_t position) {
    const float top_p = p->top_p > 0.0f && p->top_p < 1.0f ? p->top_p : 1.0f; /* 0 in a spec: off */
    const gdp_sample_row sr = {.temperature = p->temperature, .top_k = p->top_k, .top_p = top_p,
                               .position = position, .seed = p->seed};
    w[0] = row;
    memcpy(w + 1, &sr, sizeof sr);
}

/* The rows the head samples, in the order eng_consume reads them: each decode request's S
 * rows (row d * S + s, the draw of its token n_gen + n_ahead + s: tokens launched and not
 * consumed yet count), then the last row of each prefill slice that completes its prompt
 * (the first generated token; sp->pre_head[p] its head index, -1 for the other slices).
 * Prefill rows follow the plan's layout (plan.h): the block starts at the bucket's
 * decode_count * S and the slices are contiguous in order. Returns the count. */
static int32_t compose_head(struct gdp_engine *e, run *r, step_plan *sp, int32_t S, int32_t n_dec, int32_t n_pre) {
    int32_t *head = frame_head(e), n = 0;
    for (int32_t d = 0; d < n_dec; d++) {
        const rq *q = &r->r[sp->dec_req[d]];
        for (int32_t s = 0; s < S; s++)
            head_entry(head + HEAD_WORDS * n++, d * S + s, &q->spec->sampling, q->n_gen + q->n_ahead + s);
    }
    int32_t row = e->buckets[sp->desc.bucket].decode_count * S;
    for (int32_t p = 0; p < n_pre; p++) {
        const rq *q = &r->r[sp->pre_req[p]];
        row += sp->prefill[p].n_tokens;
        sp->pre_head[p] = -1;
        if (q->n_fed + sp->prefill[p].n_tokens == q->spec->prompt_len) {
            sp->pre_head[p] = n;
            head_entry(head + HEAD_WORDS * n++, row - 1, &q->spec->sampling, q->n_gen + q->n_ahead);
        }
    }
    return n;
}

/* Whether waiting request a is admitted before waiting request b (config.schedule): arrival
 * order, or the shorter prompt first unless one of them has waited schedule_age_ms (those
 * go first, in arrival order). */
static bool admits_before(const gdp_engine_config *c, const rq *a, const rq *b, double now) {
    if (c->schedule == GDP_SCHEDULE_SHORTEST) {
        const double age = 1e-3 * c->schedule_age_ms;
        const bool a_due = now - a->wait_since >= age, b_due = now - b->wait_since >= age;
        if (a_due != b_due)
            return a_due;
        if (!a_due && a->spec->prompt_len != b->spec->prompt_len)
            return a->spec->prompt_len < b->spec->prompt_len;
    }
    return a->order < b->order;
}

/* Composes the next step on the root: fills e->frame (kind STEP, or STOP when every request
 * is done and every slot released) and sp. Sleeps while only future arrivals remain.
 * ahead: the last device step is still in flight (its tokens not consumed). A decode row
 * whose input is that step's draw then carries a reference to its head row; what would
 * depend on the step's outcome sets sp->need_sync and returns before anything changes:
 * a preemption (the victim's pending token and state), nothing to run (the run may be
 * over, or only arrivals remain). */
gdp_status_t eng_compose(struct gdp_engine *e, run *r, step_plan *sp, double t0, int64_t step_no, bool ahead) {
    const gdp_engine_config *c = &e->cfg;
    int32_t *f = e->frame;
    sp->idle_s = 0;
    sp->need_sync = 0;
    for (;;) {
        memset(f, 0, sizeof(int32_t) * F_HEADER);
        memset(&sp->desc, 0, sizeof sp->desc);
        memset(r->released_now, 0, (size_t)c->n_slots);
        sp->n_freed_bufs = 0;
        int32_t *swap_out = f + F_HEADER, *swap_in = swap_out + SWAP_OUT_WORDS * c->n_slots;
        int32_t *tok = swap_in + SWAP_IN_WORDS * c->n_slots;
        int32_t n_out = 0, n_in = 0, n_rel = 0, n_acc = 0, n_dec = 0, n_pre = 0, n_tok = 0;
        const double now = eng_elapsed(t0);

        /* 1. arrivals */
        for (int32_t i = 0; i < r->n; i++)
            if (r->r[i].state == RQ_FUTURE && r->r[i].arrival <= now) {
                r->r[i].state = RQ_QUEUED;
                r->r[i].order = r->seq++;
                r->r[i].wait_since = now;
            }
        int32_t free_total = 0, due = 0; /* slots free after this step's releases */
        for (int32_t s = 0; s < c->n_slots; s++)
            free_total += r->slot_owner[s] < 0;
        /* a waiter's turn has come once it waited preempt_wait_ms for a slot */
        for (int32_t i = 0; i < r->n; i++)
            due += (r->r[i].state == RQ_QUEUED || r->r[i].state == RQ_SWAPPED) &&
                   now - r->r[i].wait_since >= 1e-3 * c->preempt_wait_ms;
        if (ahead && c->preempt && due > 0 && free_total == 0)
            for (int32_t i = 0; i < r->n; i++)
                if (r->r[i].state == RQ_DECODE && r->r[i].run_steps >= c->preempt_after) {
                    sp->need_sync = 1; /* a victim may be chosen: decide on consumed tokens */
                    return GDP_STATUS_SUCCESS;
                }
        /* 2. releases of the requests that finished last step */
        for (int32_t k = 0; k < r->n_release; k++) {
            sp->releases[n_rel++] = r->release[k];
            r->released_now[r->release[k]] = 1;
        }
        r->n_release = 0;

        /* 3. preemption, only when it helps: a waiter whose turn has come, and not even this
         *    step's releases leave it a slot */
        if (c->preempt && due > 0 && free_total == 0) {
            int32_t cap = c->n_slots / 4 > 1 ? c->n_slots / 4 : 1;
            cap = cap < due ? cap : due;
            for (int32_t v = 0; v < cap; v++) {
                int32_t best = -1;
                for (int32_t i = 0; i < r->n; i++) {
                    const rq *q = &r->r[i];
                    if (q->state == RQ_DECODE && q->run_steps >= c->preempt_after &&
                        (best < 0 || q->run_steps > r->r[best].run_steps))
                        best = i;
                }
                if (best < 0)
                    break;
                rq *q = &r->r[best];
                const int32_t buf = r->n_free_bufs > 0 ? r->free_bufs[--r->n_free_bufs] : r->n_bufs++;
                const int32_t pending = q->draft_S > 0;
                int32_t *w = swap_out + SWAP_OUT_WORDS * n_out++;
                w[0] = q->slot, w[1] = buf, w[2] = pending ? q->draft_S : 0, w[3] = pending ? q->draft_keep : 0;
                sp->releases[n_rel++] = q->slot;
                r->released_now[q->slot] = 1;
                r->slot_owner[q->slot] = -1;
                q->slot = -1, q->swap_buf = buf, q->draft_S = q->draft_keep = 0;
                q->state = RQ_SWAPPED, q->order = r->seq++, q->preemptions++, q->wait_since = now;
                e->report.preemptions++;
            }
        }
        /* 4. resumes (preemption order) into slots that were free before this step */
        for (;;) {
            int32_t best = -1, slot = -1;
            for (int32_t i = 0; i < r->n; i++)
                if (r->r[i].state == RQ_SWAPPED && (best < 0 || r->r[i].order < r->r[best].order))
                    best = i;
            for (int32_t s = 0; s < c->n_slots && slot < 0; s++)
                if (r->slot_owner[s] < 0 && !r->released_now[s])
                    slot = s;
            if (best < 0 || slot < 0)
                break;
            rq *q = &r->r[best];
            int32_t *w = swap_in + SWAP_IN_WORDS * n_in++;
            w[0] = q->swap_buf, w[1] = slot;
            sp->freed_bufs[sp->n_freed_bufs++] = q->swap_buf;
            r->slot_owner[slot] = best;
            q->slot = slot, q->swap_buf = -1, q->state = RQ_DECODE, q->run_steps = 0;
            e->report.resumes++;
        }
        /* 5. decode: every running request, S = 1 + the most drafts any of them has */
        int32_t S = 1;
        for (int32_t i = 0; i < r->n; i++) {
            rq *q = &r->r[i];
            if (q->state != RQ_DECODE)
                continue;
            sp->dec_req[n_dec] = i;
            sp->dec_slots[n_dec] = q->slot;
            int32_t k = 0;
            const int32_t room = q->spec->max_new_tokens - q->n_gen - q->n_ahead - 1; /* the last needs no draft */
            if (c->draft_tokens > 0 && room > 0)
                k = ngram_draft(q->tokens, q->n_tokens, c->ngram, c->draft_tokens < room ? c->draft_tokens : room,
                                sp->drafts + (size_t)n_dec * MAX_DRAFTS);
            sp->n_drafts[n_dec] = k;
            S = 1 + k > S ? 1 + k : S;
            if (q->draft_S > 0) {
                sp->accepts[n_acc++] = (gdp_draft_accept){.slot = q->slot, .n_accepted = q->draft_keep};
                q->draft_S = q->draft_keep = 0;
            }
            n_dec++;
        }
        if (S > 1)
            S = e->S_max; /* one padded shape per S keeps the buckets (and graphs) few */
        for (int32_t d = 0; d < n_dec; d++) {
            const rq *q = &r->r[sp->dec_req[d]];
            if (q->n_fed < q->n_tokens) {
                tok[n_tok++] = q->tokens[q->n_fed];
            } else { /* the input is the draw of the step in flight: a reference to its record */
                if (!ahead || q->pend_step != e->dev_steps || q->pend_head < 0 || q->pend_head >= e->prev_head)
                    GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "engine: request %lld's next input is a draw of device step "
                             "%lld (head row %d) but the last device step is %lld with %d rows%s",
                             (long long)q->spec->id, (long long)q->pend_step, q->pend_head, (long long)e->dev_steps,
                             e->prev_head, ahead ? "" : ", and it was consumed");
                tok[n_tok++] = -2 - q->pend_head;
            }
            for (int32_t s = 1; s < S; s++) /* past the real drafts: filler, verified like any draft */
                tok[n_tok] = s <= sp->n_drafts[d] ? sp->drafts[(size_t)d * MAX_DRAFTS + s - 1] : tok[n_tok - 1], n_tok++;
        }
        /* 6. prefill slices: running prefills first (in admission order), then new requests while
         *    slots last, in the schedule's order (admits_before) */
        int32_t budget = c->max_step_tokens - n_dec * S, slots_left = 0, pre_tokens = 0;
        for (int32_t sl = 0; sl < c->n_slots; sl++) /* new requests may also take this step's releases */
            slots_left += r->slot_owner[sl] < 0;
        for (int pass = 0; pass < 2; pass++) {
            for (;;) {
                int32_t best = -1;
                for (int32_t i = 0; i < r->n; i++) {
                    const rq *q = &r->r[i];
                    const bool cand = pass == 0 ? q->state == RQ_PREFILL : q->state == RQ_QUEUED;
                    bool taken = false;
                    for (int32_t p = 0; p < n_pre && !taken; p++)
                        taken = sp->pre_req[p] == i;
                    if (cand && !taken && (best < 0 || (pass == 0 ? q->order < r->r[best].order
                                                                  : admits_before(c, q, &r->r[best], now)))) {
                        const int32_t rem = q->spec->prompt_len - q->n_fed;
                        const int32_t slice = c->prefill_chunk > 0 && rem > c->prefill_chunk ? c->prefill_chunk : rem;
                        if (slice <= budget)
                            best = i;
                    }
                }
                if (best < 0 || n_pre >= e->max_prefill || (pass == 1 && slots_left <= 0))
                    break;
                rq *q = &r->r[best];
                const int32_t rem = q->spec->prompt_len - q->n_fed;
                const int32_t slice = c->prefill_chunk > 0 && rem > c->prefill_chunk ? c->prefill_chunk : rem;
                const bool is_new = q->state == RQ_QUEUED;
                sp->pre_req[n_pre] = best;
                sp->prefill[n_pre] = (gdp_prefill_request){.slot = is_new ? GDP_SLOT_AUTO : q->slot,
                                                           .n_tokens = slice, .flags = is_new ? GDP_PREFILL_NEW : 0};
                n_pre++;
                memcpy(tok + n_tok, q->tokens + q->n_fed, sizeof(int32_t) * (size_t)slice);
                n_tok += slice;
                budget -= slice;
                pre_tokens += slice;
                if (is_new) {
                    q->state = RQ_PREFILL;
                    q->order = r->seq++;
                    slots_left--;
                }
            }
        }

        sp->desc = (gdp_step_desc){.decode_count = n_dec, .decode_tokens = S, .decode_slots = sp->dec_slots,
                                   .prefill_count = n_pre, .prefill = sp->prefill, .release_count = n_rel,
                                   .release_slots = sp->releases, .accept_count = n_acc, .accept = sp->accepts,
                                   .bucket = GDP_BUCKET_AUTO};
        f[F_STEP] = (int32_t)step_no, f[F_SWAP_OUT] = n_out, f[F_SWAP_IN] = n_in, f[F_DECODE] = n_dec, f[F_S] = S;
        f[F_PREFILL] = n_pre, f[F_TOKENS] = n_tok;
        if (n_dec > 0 || n_pre > 0) {
            sp->desc.bucket = eng_bucket_for(e, S, n_dec, pre_tokens, n_pre);
            if (sp->desc.bucket < 0)
                GDP_FAIL(GDP_STATUS_INTERNAL_ERROR,
                         "engine: no bucket for S %d, %d decode requests, %d prefill tokens in %d slices", S, n_dec,
                         pre_tokens, n_pre);
            f[F_HEAD] = compose_head(e, r, sp, S, n_dec, n_pre);
            f[F_KIND] = FRAME_STEP;
            break;
        }
        if (n_out > 0 || n_in > 0 || n_rel > 0 || n_acc > 0) {
            f[F_KIND] = FRAME_STEP; /* slot work but no tokens: apply without a forward pass */
            f[F_RELEASE_ONLY] = 1;
            break;
        }
        if (ahead) { /* nothing to run before the step in flight is consumed */
            sp->need_sync = 1;
            return GDP_STATUS_SUCCESS;
        }
        if (r->n_done == r->n) {
            f[F_KIND] = FRAME_STOP;
            break;
        }
        /* Only future arrivals remain: wait for the next one. */
        double next = 1e30;
        for (int32_t i = 0; i < r->n; i++)
            if (r->r[i].state == RQ_FUTURE && r->r[i].arrival < next)
                next = r->r[i].arrival;
        if (next > 1e29)
            GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "engine: %d of %d requests are done, none can be scheduled", r->n_done,
                     r->n);
        const double wait = next - eng_elapsed(t0);
        if (wait > 0) {
            struct timespec ts = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - floor(wait)) * 1e9)};
            const double ti = eng_now();
            /* the peers wait for this step's frame meanwhile: with the comm, the sleep answers
             * the watchdog's probes as idle, so a long gap between arrivals is not a stall */
            if (e->comm == NULL || gdp_comm_sleep(e->comm, wait) != GDP_STATUS_SUCCESS)
                nanosleep(&ts, NULL);
            sp->idle_s += eng_now() - ti;
        }
    }
    for (int32_t k = 0; k < sp->n_freed_bufs; k++)
        r->free_bufs[r->n_free_bufs++] = sp->freed_bufs[k];
    return GDP_STATUS_SUCCESS;
}
