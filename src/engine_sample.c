/*
 * engine_sample.c: what the root does with a step's sampled tokens (engine_internal.h). The
 * device sampled every head row (gdp_model_sample); only its gdp_sample_out records (token,
 * top-2 margin, max |logit|, flags) came back. Here they become requests' tokens, in the
 * order compose laid the head rows: each decode request's S rows, then the prefill slices
 * that completed their prompts. Draft verification keeps the sampled tokens while each
 * equals the next input (exact for sampling too: a draw depends only on the seed, the
 * position and the logits). A request ends at max_new_tokens, after emitting one of its stop
 * ids, or failed (non-finite logits); the result callback streams it as it ends.
 *
 * A step is taken in two parts, so the root can compose the next step before it has read
 * this one's tokens (docs/gdp-run.md, "The step pipeline"): eng_advance, as the step is
 * launched, does what does not depend on the draws (slots of new requests, fed tokens,
 * prompts completed, the pending draw of each row, and a request whose last token by
 * max_new_tokens is drawn here releases its slot now); eng_consume, once the step finished,
 * emits the draws. A request that ended at a draw (a stop id, an error) may already have a
 * row in the next step: that row's draw is dropped, never emitted.
 */
#include <stdarg.h>

#include "engine_internal.h"

/* Greedy choice with its top-2 margin and the logits' max |value| (host logits: checks). */
int32_t eng_argmax(const float *l, int64_t V, float *margin, float *scale) {
    int32_t best = 0, second = -1;
    float mx = fabsf(l[0]);
    for (int64_t v = 1; v < V; v++) {
        mx = fabsf(l[v]) > mx ? fabsf(l[v]) : mx;
        if (l[v] > l[best]) {
            second = best;
            best = (int32_t)v;
        } else if (second < 0 || l[v] > l[second]) {
            second = (int32_t)v;
        }
    }
    *margin = second >= 0 ? l[best] - l[second] : INFINITY;
    *scale = mx;
    return best;
}

void eng_result(const struct gdp_engine *e, const run *r, int32_t index, gdp_request_result *out) {
    const rq *q = &r->r[index];
    (void)e;
    *out = (gdp_request_result){.index = index, .id = q->spec->id, .prompt_len = q->spec->prompt_len,
                                .n_generated = q->n_gen, .tokens = q->tokens + q->spec->prompt_len,
                                .margin = q->margin, .logit_scale = q->scale, .arrival_s = q->arrival,
                                .first_token_s = q->first_token, .finish_s = q->finish,
                                .preemptions = q->preemptions, .drafts_proposed = q->drafts_proposed,
                                .drafts_accepted = q->drafts_accepted, .finish_reason = q->finish_reason,
                                .error = q->finish_reason == GDP_FINISH_ERROR ? q->error : NULL};
}

/* Appends a generated token to a request. */
static void emit(run *r, int32_t index, int32_t token, float margin, float scale, double t) {
    rq *q = &r->r[index];
    q->tokens[q->n_tokens++] = token;
    q->margin[q->n_gen] = margin;
    q->scale[q->n_gen] = scale;
    if (q->n_gen == 0)
        q->first_token = t;
    else
        r->itl[r->n_itl++] = t - q->last_token_s;
    q->last_token_s = t;
    q->n_gen++;
    r->work_done++;
}

static void finish(struct gdp_engine *e, run *r, int32_t index, double t, int32_t reason) {
    rq *q = &r->r[index];
    q->state = RQ_DONE;
    q->finish = t;
    q->finish_reason = reason;
    if (q->slot >= 0) {
        r->release[r->n_release++] = q->slot;
        r->slot_owner[q->slot] = -1;
    }
    q->slot = -1;
    q->draft_S = q->draft_keep = 0;
    r->work_done += q->spec->max_new_tokens - q->n_gen; /* what it will not generate */
    r->n_done++;
    if (r->stream_results && e->cfg.on_result != NULL) {
        gdp_request_result res;
        eng_result(e, r, index, &res);
        e->cfg.on_result(&res, e->cfg.on_result_user);
    }
}

void eng_fail_request(struct gdp_engine *e, run *r, int32_t index, double t, const char *fmt, ...) {
    rq *q = &r->r[index];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->error, sizeof q->error, fmt, ap);
    va_end(ap);
    finish(e, r, index, t, GDP_FINISH_ERROR);
}

static bool is_stop(const rq *q, int32_t token) {
    for (int32_t k = 0; k < q->spec->n_stop; k++)
        if (q->spec->stop[k] == token)
            return true;
    return false;
}

/* Emits one sampled token; returns false when the request ended with it (or failed). */
static bool take(struct gdp_engine *e, run *r, int32_t index, const gdp_sample_out *o, double t) {
    rq *q = &r->r[index];
    if (o->flags & GDP_SAMPLE_NONFINITE) {
        eng_fail_request(e, r, index, t,
                         "request %lld: the logits of generated token %d hold NaN or Inf (a non-finite weight or "
                         "state; load the checkpoint with its finite check on)", (long long)q->spec->id, q->n_gen);
        return false;
    }
    if (o->flags & GDP_SAMPLE_INVALID_ROW) { /* validated on the host: a bug if it happens */
        eng_fail_request(e, r, index, t, "request %lld: the device refused the sampling options of token %d",
                         (long long)q->spec->id, q->n_gen);
        return false;
    }
    emit(r, index, o->token, o->margin, o->scale, t);
    if (is_stop(q, o->token)) {
        finish(e, r, index, t, GDP_FINISH_STOP);
        return false;
    }
    if (q->n_gen >= q->spec->max_new_tokens) {
        finish(e, r, index, t, GDP_FINISH_LENGTH);
        return false;
    }
    return true;
}

/* Check mode: the rows of x whose full logits are kept (eng_advance, from the step's own
 * frame), in the order eng_consume reads them. */
static void logit_rows(struct gdp_engine *e, run *r, step_plan *sp) {
    const int32_t *head = frame_head(e);
    const int32_t S = sp->desc.decode_tokens;
    int32_t n = 0, k = 0;
    for (int32_t d = 0; d < sp->desc.decode_count; d++)
        for (int32_t s = 0; s < S; s++, k++)
            if (sp->dec_req[d] < r->keep_logits && !r->first_logits)
                sp->logit_rows[n++] = head[HEAD_WORDS * k];
    for (int32_t p = 0; p < sp->desc.prefill_count; p++)
        if (sp->pre_head[p] >= 0 && sp->pre_req[p] < r->keep_logits)
            sp->logit_rows[n++] = head[HEAD_WORDS * sp->pre_head[p]];
    sp->n_logit = n;
    sp->logits_done = 0;
}

/* Check mode: the kept rows' full logits (host path, fp32 head) from x, once the step
 * finished and before the next one overwrites x. */
gdp_status_t eng_keep_logits(struct gdp_engine *e, step_plan *sp) {
    if (sp->n_logit == 0 || sp->logits_done)
        return GDP_STATUS_SUCCESS;
    gdp_tensor xt;
    GDP_CHECK(gdp_tensor_init(&xt, e->x, GDP_DTYPE_FP32, 2, (const int64_t[]){sp->padded_rows, e->D}));
    GDP_CHECK(gdp_model_logits(e->model, e->logits, &xt, sp->logit_rows, sp->n_logit));
    sp->logits_done = 1;
    return GDP_STATUS_SUCCESS;
}

/* Copies a kept request's logits: the last of its step (check mode keeps the first token's
 * logits of the recompute run, the last one's of the main run). */
static void store_kept(struct gdp_engine *e, run *r, int32_t index, const float *l) {
    const rq *q = &r->r[index];
    if (index < r->keep_logits && (!r->first_logits || q->n_gen == 1))
        memcpy(r->kept_logits + (size_t)index * (size_t)e->vocab, l, sizeof(float) * (size_t)e->vocab);
}

/* A request whose draw in the step being launched is its last by max_new_tokens: its slot is
 * released by the next step (as when it finished), and it is done once the draw is read. */
static void ending(run *r, rq *q) {
    q->state = RQ_ENDING;
    if (q->slot >= 0) {
        r->release[r->n_release++] = q->slot;
        r->slot_owner[q->slot] = -1;
    }
    q->slot = -1;
}

void eng_advance(struct gdp_engine *e, run *r, step_plan *sp, const gdp_step_metadata *m) {
    const int32_t S = sp->desc.decode_tokens;
    sp->padded_rows = m->padded_token_count;
    logit_rows(e, r, sp);
    for (int32_t d = 0; d < sp->desc.decode_count; d++) {
        rq *q = &r->r[sp->dec_req[d]];
        q->run_steps++;
        if (S > 1)
            continue; /* draft steps: how many inputs are kept depends on the draws (consume) */
        q->n_fed++; /* the pending token is fed */
        q->n_ahead++;
        q->pend_head = d, q->pend_step = e->dev_steps + 1; /* the step being launched */
        if (q->n_gen + q->n_ahead >= q->spec->max_new_tokens)
            ending(r, q);
    }
    for (int32_t p = 0; p < sp->desc.prefill_count; p++) {
        const int32_t i = sp->pre_req[p];
        rq *q = &r->r[i];
        if (sp->prefill[p].flags & GDP_PREFILL_NEW) {
            q->slot = m->step->prefill[p].slot; /* resolved from GDP_SLOT_AUTO by the plan */
            r->slot_owner[q->slot] = i;
        }
        q->n_fed += sp->prefill[p].n_tokens;
        r->work_done += sp->prefill[p].n_tokens;
        if (sp->pre_head[p] < 0)
            continue;
        q->state = RQ_DECODE; /* its first token is drawn here */
        q->run_steps = 0;
        q->n_ahead++;
        q->pend_head = sp->pre_head[p], q->pend_step = e->dev_steps + 1;
        if (q->n_gen + q->n_ahead >= q->spec->max_new_tokens)
            ending(r, q);
    }
}

gdp_status_t eng_consume(struct gdp_engine *e, run *r, step_plan *sp, const gdp_sample_out *out, double t0) {
    const int32_t S = sp->desc.decode_tokens, n_dec = sp->desc.decode_count, n_pre = sp->desc.prefill_count;
    const int32_t *inputs = frame_tokens(e); /* read for drafts only, whose steps finish at once */
    GDP_CHECK(eng_keep_logits(e, sp)); /* check mode, unless taken before the next launch */
    const double t = eng_elapsed(t0);
    int32_t k = 0, kept_row = 0;
    for (int32_t d = 0; d < n_dec; d++, k += S) {
        const int32_t i = sp->dec_req[d];
        rq *q = &r->r[i];
        const bool keeps = i < r->keep_logits && !r->first_logits;
        if (q->state == RQ_DONE) { /* ended at an earlier draw: this row's draw is dropped */
            kept_row += keeps ? S : 0;
            continue;
        }
        if (S == 1)
            q->n_ahead--;
        int32_t kept = 0;
        bool live = true;
        for (int32_t s = 0; s < S && live; s++) {
            live = take(e, r, i, &out[k + s], t);
            if (keeps)
                store_kept(e, r, i, e->logits + (size_t)(kept_row + s) * (size_t)e->vocab);
            kept++;
            if (s + 1 >= S || out[k + s].token != inputs[d * S + s + 1])
                break; /* the next input was not the sampled token: the rest is rejected */
        }
        kept_row += keeps ? S : 0;
        const int32_t accepted = kept - 1 < sp->n_drafts[d] ? kept - 1 : sp->n_drafts[d];
        q->drafts_proposed += sp->n_drafts[d];
        q->drafts_accepted += accepted;
        e->report.drafts_proposed += sp->n_drafts[d];
        e->report.drafts_accepted += accepted;
        if (!live || S == 1)
            continue; /* S = 1: eng_advance fed the token */
        q->n_fed += kept; /* inputs whose state is kept: the pending token and kept - 1 drafts */
        if (kept < S)
            q->draft_S = S, q->draft_keep = kept; /* rolled back by next step's accept */
    }
    for (int32_t p = 0; p < n_pre; p++) {
        const int32_t i = sp->pre_req[p];
        rq *q = &r->r[i];
        if (sp->pre_head[p] < 0)
            continue;
        if (q->state == RQ_DONE) {
            kept_row += i < r->keep_logits;
            continue;
        }
        q->n_ahead--;
        (void)take(e, r, i, &out[sp->pre_head[p]], t);
        if (i < r->keep_logits)
            store_kept(e, r, i, e->logits + (size_t)(kept_row++) * (size_t)e->vocab);
    }
    return GDP_STATUS_SUCCESS;
}
