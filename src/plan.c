/*
 * plan.c: the step plan (include/gdp/plan.h). The root's gdp_step_desc is serialized into
 * one fixed-size int32 frame and broadcast (a failing root broadcasts its error instead,
 * so every rank returns it); every rank then validates the step against its cache's slot
 * state and the buckets, resolves GDP_SLOT_AUTO, and writes the step's metadata (slot
 * arrays, cu_seqlens, chunk descriptors, conv per-token metadata, snapshot saves, and
 * the resolved step itself) into one contiguous host buffer, copied to the device in one
 * transfer. Validation happens before the first write, and the ranks agree on its outcome
 * (one host all-reduce per step), so a step one rank refuses is refused by every rank and
 * the layers' forward passes need no agreement of their own. The buffer also carries the
 * step's slot fills (zero, draft rollback, snapshot restore) for gdp_cache_apply_step,
 * which the device then carries out in one launch from the same upload.
 *
 * The host buffer is double-buffered (pinned on CUDA) and its upload is queued without a
 * wait, so a caller may build step n + 1 while the device still runs step n (the engine's
 * pipelined loop): a build writes the buffer whose previous upload (two builds ago) has
 * finished, which an event recorded after each upload tells; the device copy is one buffer,
 * rewritten in stream order after the step that read it.
 */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "cache_internal.h"
#include "step_meta.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#endif

#define GDP_PLAN_MAGIC 0x67647070u  /* "gdpp" */
#define FRAME_MAGIC    0x53504447   /* "GDPS": a step frame        */
#define FRAME_HEADER   16           /* int32 words before the payload */
#define FRAME_MIN_MSG  512          /* bytes of payload an error message may use, at least */
#define PREFILL_WORDS  6            /* int32 words of one gdp_prefill_request */
#define ACCEPT_WORDS   2

_Static_assert(sizeof(gdp_prefill_request) == PREFILL_WORDS * sizeof(int32_t),
               "gdp_prefill_request is serialized as 6 int32 words");
_Static_assert(sizeof(gdp_draft_accept) == ACCEPT_WORDS * sizeof(int32_t),
               "gdp_draft_accept is serialized as 2 int32 words");

/* Frame header words. */
enum {
    F_MAGIC = 0, F_STATUS, F_DECODE_COUNT, F_DECODE_TOKENS, F_PREFILL_COUNT, F_RELEASE_COUNT, F_ACCEPT_COUNT,
    F_BUCKET, F_MSG_BYTES
};

struct gdp_plan {
    uint32_t         magic;
    gdp_ctx_t        ctx;
    gdp_plan_config  cfg;            /* buckets points at `buckets` below                 */
    gdp_step_bucket *buckets;
    int32_t          max_decode;     /* largest bucket decode_count                       */
    int32_t          max_prefill;    /* largest bucket prefill_count                      */
    /* the broadcast frame */
    int32_t         *frame;
    size_t           frame_words;
    /* the step received (arrays in `step_store`) */
    int32_t          have_step;
    gdp_step_desc    step;
    int32_t         *step_store;
    /* the metadata */
    int32_t         *meta_bufs[2];   /* host buffers, used in turn (pinned on CUDA)       */
    void            *upload_done[2]; /* CUDA: an event after each buffer's last upload    */
    int32_t          meta_next;      /* the buffer the next build writes                  */
    size_t           meta_words;     /* the capacity of each                              */
    void            *meta_dev;       /* device copy (CUDA), NULL on CPU                   */
    uint8_t         *slot_scratch;   /* [n_slots] the slot table while validating a step  */
    int32_t          have_meta;
    gdp_step_metadata meta;
    gdp_step_desc    resolved;       /* the built step; arrays inside its meta buffer     */
    uint32_t         magic_end;
};

static gdp_status_t check_plan(const struct gdp_plan *p, const char *op) {
    if (p == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: plan is NULL; create it with gdp_plan_init()", op);
    if (p->magic != GDP_PLAN_MAGIC || p->magic_end != GDP_PLAN_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: plan %p is not a live gdp plan (freed or corrupted)", op,
                 (const void *)p);
    return GDP_STATUS_SUCCESS;
}

/* int32 words of the metadata of one bucket (S = 1 gives the most prefill rows). */
static gdp_status_t bucket_meta_words(const gdp_plan_config *c, const gdp_step_bucket *b, size_t *words) {
    int64_t nc, ncdp;
    GDP_CHECK(gdp_max_chunk_counts(b->token_count, b->prefill_count, c->num_householder, &nc, &ncdp));
    const size_t pd = (size_t)b->decode_count, pp = (size_t)b->prefill_count, rows = (size_t)b->token_count;
    *words = pd + pp + 2 * (pp + 1) + 2 * (size_t)nc + 2 * (size_t)ncdp + 3 * rows + 5 * pp;
    return GDP_STATUS_SUCCESS;
}


gdp_status_t gdp_plan_init(gdp_plan_t *out, gdp_ctx_t ctx, const gdp_plan_config *config) {
    static const char *op = "gdp_plan_init";
    if (out == NULL || config == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out and config must not be NULL", op);
    *out = NULL;
    GDP_CHECK(gdp_ctx_check(ctx, op));
    const gdp_plan_config *c = config;
    if (c->num_householder < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.num_householder is %d, must be >= 1", op, c->num_householder);
    if (c->n_slots < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config.n_slots is %d, must be >= 1 (the cache's slots)", op,
                 c->n_slots);
    if (c->max_decode_tokens < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: config.max_decode_tokens is %d, must be >= 1 (1 + the most draft tokens a step carries)", op,
                 c->max_decode_tokens);
    if (c->n_buckets < 1 || c->buckets == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: config has %d buckets%s; pass at least one padded step shape", op,
                 c->n_buckets, c->buckets == NULL ? " (buckets is NULL)" : "");
    int32_t max_decode = 0, max_prefill = 0;
    size_t meta_words = 0;
    for (int32_t b = 0; b < c->n_buckets; b++) {
        const gdp_step_bucket *bk = &c->buckets[b];
        if (bk->decode_count < 0 || bk->prefill_count < 0 || bk->token_count < 1)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: bucket %d is (decode %d, prefill %d, tokens %d); counts must be >= 0 and tokens >= 1", op,
                     b, bk->decode_count, bk->prefill_count, bk->token_count);
        if ((int64_t)bk->decode_count > bk->token_count)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: bucket %d has %d decode requests but only %d token rows; each decode request needs at "
                     "least one row",
                     op, b, bk->decode_count, bk->token_count);
        size_t w;
        GDP_CHECK(bucket_meta_words(c, bk, &w));
        if (w > meta_words)
            meta_words = w;
        if (bk->decode_count > max_decode)
            max_decode = bk->decode_count;
        if (bk->prefill_count > max_prefill)
            max_prefill = bk->prefill_count;
    }
    /* The slot fills (at most one per accept and per prefill request) and the resolved step
     * ride in the metadata buffer, after the arrays. */
    meta_words += M_HEADER_WORDS + ((size_t)c->n_slots + (size_t)max_prefill) * FILL_WORDS + (size_t)max_decode +
                  (size_t)max_prefill * PREFILL_WORDS + (size_t)c->n_slots * (1 + ACCEPT_WORDS);
    size_t frame_words = FRAME_HEADER + (size_t)max_decode + (size_t)max_prefill * PREFILL_WORDS +
                         (size_t)c->n_slots * (1 + ACCEPT_WORDS);
    if (frame_words < FRAME_HEADER + FRAME_MIN_MSG / sizeof(int32_t))
        frame_words = FRAME_HEADER + FRAME_MIN_MSG / sizeof(int32_t);

    struct gdp_plan *p = gdp_calloc(1, sizeof *p, "gdp_plan");
    if (p == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    p->magic = p->magic_end = GDP_PLAN_MAGIC;
    p->ctx = ctx;
    p->cfg = *c;
    p->max_decode = max_decode;
    p->max_prefill = max_prefill;
    p->frame_words = frame_words;
    p->meta_words = meta_words;
    p->buckets = gdp_calloc((size_t)c->n_buckets, sizeof *p->buckets, "the plan's buckets");
    p->frame = gdp_calloc(frame_words, sizeof(int32_t), "the plan's step frame");
    p->step_store = gdp_calloc(frame_words, sizeof(int32_t), "the plan's step");
    p->slot_scratch = gdp_calloc((size_t)c->n_slots, 1, "the plan's slot table");
    gdp_status_t st = GDP_STATUS_SYSTEM_ERROR;
    if (p->buckets == NULL || p->frame == NULL || p->step_store == NULL || p->slot_scratch == NULL)
        goto fail;
    for (int k = 0; k < 2; k++) {
#ifdef GDP_HAVE_CUDA
        if (ctx->backend != GDP_BACKEND_CPU) {
            void *h = NULL;
            cudaEvent_t ev = NULL;
            cudaError_t why = cudaHostAlloc(&h, meta_words * sizeof(int32_t), cudaHostAllocDefault);
            if (why == cudaSuccess)
                why = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
            if (why != cudaSuccess) {
                if (h != NULL)
                    cudaFreeHost(h);
                st = gdp_cuda_error(why, __FILE__, __LINE__, "%s: the pinned metadata buffer (%zu bytes) or its event",
                                    op, meta_words * sizeof(int32_t));
                goto fail;
            }
            memset(h, 0, meta_words * sizeof(int32_t));
            p->meta_bufs[k] = h;
            p->upload_done[k] = ev;
            continue;
        }
#endif
        p->meta_bufs[k] = gdp_calloc(meta_words, sizeof(int32_t), "the plan's metadata buffer");
        if (p->meta_bufs[k] == NULL)
            goto fail;
    }
    memcpy(p->buckets, c->buckets, (size_t)c->n_buckets * sizeof *p->buckets);
    p->cfg.buckets = p->buckets;
    if (ctx->backend != GDP_BACKEND_CPU)
        GDP_CHECK_GOTO(gdp_buf_alloc(ctx, meta_words * sizeof(int32_t), &p->meta_dev,
                                     "the plan's device metadata buffer"),
                       st, fail);
    *out = p;
    return GDP_STATUS_SUCCESS;
fail:
    gdp_plan_free(p);
    return st;
}

gdp_status_t gdp_plan_free(gdp_plan_t plan) {
    if (plan == NULL)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(check_plan(plan, "gdp_plan_free"));
    for (int k = 0; k < 2; k++) {
#ifdef GDP_HAVE_CUDA
        if (plan->upload_done[k] != NULL) {
            /* an upload still queued reads the buffer: let it finish first */
            (void)cudaEventSynchronize((cudaEvent_t)plan->upload_done[k]);
            (void)cudaEventDestroy((cudaEvent_t)plan->upload_done[k]);
            (void)cudaFreeHost(plan->meta_bufs[k]);
            continue;
        }
#endif
        free(plan->meta_bufs[k]);
    }
    gdp_buf_free(plan->ctx, plan->meta_dev);
    free(plan->buckets);
    free(plan->frame);
    free(plan->step_store);
    free(plan->slot_scratch);
    plan->magic = plan->magic_end = 0;
    free(plan);
    return GDP_STATUS_SUCCESS;
}

/* ---- broadcast ------------------------------------------------------------------------ */

/* Root-side checks that the desc fits the frame. Writes nothing. */
static gdp_status_t check_desc_fits(const struct gdp_plan *p, const gdp_step_desc *d, const char *op) {
    if (d == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the root's desc is NULL; the root must pass the step", op);
    const int32_t S = d->decode_tokens == 0 ? 1 : d->decode_tokens;
    if (d->decode_count < 0 || d->decode_count > p->max_decode)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: decode_count is %d; it must be in [0, %d] (the largest bucket's decode requests)", op,
                 d->decode_count, p->max_decode);
    if (d->prefill_count < 0 || d->prefill_count > p->max_prefill)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: prefill_count is %d; it must be in [0, %d] (the largest bucket's prefill requests)", op,
                 d->prefill_count, p->max_prefill);
    if (d->release_count < 0 || d->release_count > p->cfg.n_slots)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: release_count is %d; it must be in [0, %d] (n_slots)", op,
                 d->release_count, p->cfg.n_slots);
    if (d->accept_count < 0 || d->accept_count > p->cfg.n_slots)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: accept_count is %d; it must be in [0, %d] (n_slots)", op,
                 d->accept_count, p->cfg.n_slots);
    if (S < 1 || S > p->cfg.max_decode_tokens)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: decode_tokens is %d; it must be in [1, %d] (config.max_decode_tokens), or 0 for 1", op,
                 d->decode_tokens, p->cfg.max_decode_tokens);
    if ((d->decode_count > 0 && d->decode_slots == NULL) || (d->prefill_count > 0 && d->prefill == NULL) ||
        (d->release_count > 0 && d->release_slots == NULL) || (d->accept_count > 0 && d->accept == NULL))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: an array of the desc is NULL for a non-zero count (decode %d, prefill %d, release %d, accept "
                 "%d)",
                 op, d->decode_count, d->prefill_count, d->release_count, d->accept_count);
    if (d->bucket != GDP_BUCKET_AUTO && (d->bucket < 0 || d->bucket >= p->cfg.n_buckets))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: bucket is %d; it must be GDP_BUCKET_AUTO (-1) or in [0, %d)", op,
                 d->bucket, p->cfg.n_buckets);
    return GDP_STATUS_SUCCESS;
}

static void serialize(int32_t *f, size_t words, const gdp_step_desc *d) {
    memset(f, 0, words * sizeof(int32_t));
    f[F_MAGIC] = FRAME_MAGIC;
    f[F_STATUS] = GDP_STATUS_SUCCESS;
    f[F_DECODE_COUNT] = d->decode_count;
    f[F_DECODE_TOKENS] = d->decode_tokens == 0 ? 1 : d->decode_tokens;
    f[F_PREFILL_COUNT] = d->prefill_count;
    f[F_RELEASE_COUNT] = d->release_count;
    f[F_ACCEPT_COUNT] = d->accept_count;
    f[F_BUCKET] = d->bucket;
    int32_t *w = f + FRAME_HEADER;
    for (int32_t i = 0; i < d->decode_count; i++)
        *w++ = d->decode_slots[i];
    for (int32_t i = 0; i < d->prefill_count; i++) {
        const gdp_prefill_request *r = &d->prefill[i];
        *w++ = r->slot, *w++ = r->n_tokens, *w++ = r->flags;
        *w++ = r->restore_snapshot, *w++ = r->save_snapshot, *w++ = r->save_offset;
    }
    for (int32_t i = 0; i < d->release_count; i++)
        *w++ = d->release_slots[i];
    for (int32_t i = 0; i < d->accept_count; i++)
        *w++ = d->accept[i].slot, *w++ = d->accept[i].n_accepted;
}

/* The frame -> the plan's step (arrays in step_store). The frame is trusted: it came from
 * serialize() on the root, and its counts were checked there against the same config. */
static void deserialize(struct gdp_plan *p, const int32_t *f) {
    gdp_step_desc *d = &p->step;
    memset(d, 0, sizeof *d);
    d->decode_count = f[F_DECODE_COUNT];
    d->decode_tokens = f[F_DECODE_TOKENS];
    d->prefill_count = f[F_PREFILL_COUNT];
    d->release_count = f[F_RELEASE_COUNT];
    d->accept_count = f[F_ACCEPT_COUNT];
    d->bucket = f[F_BUCKET];
    const size_t payload = (size_t)d->decode_count + (size_t)d->prefill_count * PREFILL_WORDS +
                           (size_t)d->release_count + (size_t)d->accept_count * ACCEPT_WORDS;
    memcpy(p->step_store, f + FRAME_HEADER, payload * sizeof(int32_t));
    int32_t *w = p->step_store;
    d->decode_slots = w, w += d->decode_count;
    d->prefill = (const gdp_prefill_request *)w, w += (size_t)d->prefill_count * PREFILL_WORDS;
    d->release_slots = w, w += d->release_count;
    d->accept = (const gdp_draft_accept *)w;
    p->have_step = 1;
    p->have_meta = 0;
}

gdp_status_t gdp_plan_bcast(gdp_plan_t plan, gdp_comm_t comm, int32_t root, const gdp_step_desc *desc) {
    static const char *op = "gdp_plan_bcast";
    GDP_CHECK(check_plan(plan, op));
    int32_t rank = 0, size = 1;
    if (comm != NULL) {
        GDP_CHECK(gdp_comm_rank(comm, &rank));
        GDP_CHECK(gdp_comm_size(comm, &size));
    }
    if (root < 0 || root >= size)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: root is %d; it must be in [0, %d) (the comm's ranks)", op, root,
                 size);
    int32_t *f = plan->frame;
    if (rank == root) {
        gdp_status_t st = check_desc_fits(plan, desc, op);
        if (st == GDP_STATUS_SUCCESS) {
            serialize(f, plan->frame_words, desc);
        } else {
            /* Send the failure instead of the step so that no rank waits for one. */
            memset(f, 0, plan->frame_words * sizeof(int32_t));
            f[F_MAGIC] = FRAME_MAGIC;
            f[F_STATUS] = (int32_t)st;
            const size_t cap = (plan->frame_words - FRAME_HEADER) * sizeof(int32_t);
            const char *msg = gdp_last_error();
            size_t n = strlen(msg);
            if (n >= cap)
                n = cap - 1;
            memcpy(f + FRAME_HEADER, msg, n);
            f[F_MSG_BYTES] = (int32_t)n;
        }
    }
    if (comm != NULL)
        GDP_CHECK(gdp_comm_host_bcast(comm, f, plan->frame_words * sizeof(int32_t), root));
    if (f[F_MAGIC] != FRAME_MAGIC)
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR,
                 "%s: the step frame from rank %d has magic 0x%x, expected 0x%x (ranks built with different plan "
                 "configs?)",
                 op, root, (unsigned)f[F_MAGIC], (unsigned)FRAME_MAGIC);
    if (f[F_STATUS] != GDP_STATUS_SUCCESS) {
        if (rank == root)
            return (gdp_status_t)f[F_STATUS]; /* its own message is already recorded */
        char msg[FRAME_MIN_MSG + 1];
        size_t n = (size_t)f[F_MSG_BYTES];
        if (n > FRAME_MIN_MSG)
            n = FRAME_MIN_MSG;
        memcpy(msg, f + FRAME_HEADER, n);
        msg[n] = 0;
        GDP_FAIL(GDP_STATUS_REMOTE_ERROR, "%s: rank %d could not send the step: %s", op, root, msg);
    }
    deserialize(plan, f);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_plan_get_step(gdp_plan_t plan, const gdp_step_desc **desc) {
    GDP_CHECK(check_plan(plan, "gdp_plan_get_step"));
    if (desc == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_plan_get_step: desc out-pointer is NULL");
    if (!plan->have_step)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "gdp_plan_get_step: the plan holds no step yet; call gdp_plan_bcast first");
    *desc = &plan->step;
    return GDP_STATUS_SUCCESS;
}

/* ---- validation against the cache ------------------------------------------------------ */

/* Does step (with S tokens per decode request and `tokens` prefill tokens) fit bucket b?
 * If not and why != NULL, writes the reason. */
static bool fits_bucket(const gdp_step_bucket *b, const gdp_step_desc *d, int64_t tokens, char *why, size_t n) {
    const int64_t S = d->decode_tokens;
    if (d->decode_count > b->decode_count) {
        if (why)
            snprintf(why, n, "%d decode requests > the bucket's %d", d->decode_count, b->decode_count);
        return false;
    }
    if (d->prefill_count > b->prefill_count) {
        if (why)
            snprintf(why, n, "%d prefill requests > the bucket's %d", d->prefill_count, b->prefill_count);
        return false;
    }
    const int64_t need = (int64_t)b->decode_count * S + tokens;
    if (need > b->token_count) {
        if (why)
            snprintf(why, n,
                     "%lld token rows (the bucket's %d decode requests x S = %lld, plus %lld prefill tokens) > the "
                     "bucket's %d",
                     (long long)need, b->decode_count, (long long)S, (long long)tokens, b->token_count);
        return false;
    }
    return true;
}

/* Checks the step against the cache and buckets. On success fills the resolved slots of
 * the prefill requests into new_slots[] and the bucket into *bucket. Writes nothing else. */
static gdp_status_t validate_step(struct gdp_plan *p, const struct gdp_cache *cache, const gdp_step_desc *d,
                                  int32_t *new_slots, int32_t *bucket, int64_t *prefill_tokens, const char *op) {
    const gdp_cache_config *cc = &cache->cfg;
    const int32_t n_slots = cc->n_slots, S = d->decode_tokens;
    if (n_slots != p->cfg.n_slots)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the cache has %d slots but the plan was configured for %d; use the same n_slots for both", op,
                 n_slots, p->cfg.n_slots);
    if (S > 1 && cc->max_draft_tokens > 0 && S > cc->max_draft_tokens)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: the step decodes S = %d tokens per request but the cache keeps draft states for at most %d "
                 "(config.max_draft_tokens)",
                 op, S, cc->max_draft_tokens);
    uint8_t *used = p->slot_scratch; /* 0 free, 1 in use, 2 named by this step's forward */
    memcpy(used, cache->slot_used, (size_t)n_slots);
#define SLOT_RANGE(what, idx, s)                                                                                  \
    do {                                                                                                          \
        if ((s) < 0 || (s) >= n_slots)                                                                            \
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s %d names slot %d, outside [0, %d) (the cache's slots)", \
                     op, what, (int)(idx), (int)(s), n_slots);                                                    \
    } while (0)

    /* Accepts, against the pending draft steps. */
    for (int32_t a = 0; a < d->accept_count; a++) {
        const int32_t s = d->accept[a].slot, n = d->accept[a].n_accepted;
        SLOT_RANGE("accept", a, s);
        if (!used[s])
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: accept %d names slot %d, which is not in use", op, a, s);
        const int32_t pending = cache->draft_tokens[s];
        if (pending == 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: accept %d names slot %d, whose last step was not a draft step (no decode step with S > 1 "
                     "since; or the cache keeps no draft states: config.max_draft_tokens = %d)",
                     op, a, s, cc->max_draft_tokens);
        if (n < 1 || n > pending)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: accept %d keeps n_accepted = %d tokens of slot %d, outside [1, %d] (the S of its draft step)",
                     op, a, n, s, pending);
        for (int32_t e = 0; e < a; e++)
            if (d->accept[e].slot == s)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: accepts %d and %d both name slot %d", op, e, a, s);
    }
    /* Releases. */
    for (int32_t r = 0; r < d->release_count; r++) {
        const int32_t s = d->release_slots[r];
        SLOT_RANGE("release", r, s);
        if (!used[s])
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: release %d names slot %d, which is not in use (released twice, or never claimed)", op, r, s);
        used[s] = 0;
    }
    /* Slot exhaustion: count before naming individual slots, so the message says why. */
    int32_t n_new = 0, n_free = 0;
    for (int32_t i = 0; i < d->prefill_count; i++)
        n_new += (d->prefill[i].flags & GDP_PREFILL_NEW) != 0;
    for (int32_t s = 0; s < n_slots; s++)
        n_free += !used[s];
    if (n_new > n_free)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: slot exhaustion: %d new requests need slots but only %d of the cache's %d slots are free "
                 "(after this step's %d releases); admit fewer requests this step, release finished ones, or size "
                 "the cache with more slots",
                 op, n_new, n_free, n_slots, d->release_count);
    /* Prefill requests, in order; GDP_SLOT_AUTO takes the lowest free slot. */
    int64_t tokens = 0;
    for (int32_t i = 0; i < d->prefill_count; i++) {
        const gdp_prefill_request *r = &d->prefill[i];
        int32_t s = r->slot;
        if (r->n_tokens < 1)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: prefill request %d has n_tokens = %d, must be >= 1", op, i,
                     r->n_tokens);
        tokens += r->n_tokens;
        if (r->flags & ~(GDP_PREFILL_NEW | GDP_PREFILL_RESTORE | GDP_PREFILL_SAVE))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: prefill request %d has unknown flags 0x%x", op, i,
                     (unsigned)r->flags);
        if (r->flags & GDP_PREFILL_NEW) {
            if (s == GDP_SLOT_AUTO) {
                for (s = 0; s < n_slots && used[s]; s++) {
                }
            } else {
                SLOT_RANGE("new prefill request", i, s);
                if (used[s])
                    GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                             "%s: new prefill request %d claims slot %d, which is %s; pick a free slot or "
                             "GDP_SLOT_AUTO",
                             op, i, s, used[s] == 2 ? "named earlier in this step" : "in use");
            }
        } else {
            if (s == GDP_SLOT_AUTO)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: prefill request %d uses GDP_SLOT_AUTO without GDP_PREFILL_NEW; a continuing request "
                         "names its slot",
                         op, i);
            SLOT_RANGE("prefill request", i, s);
            if (used[s] != 1)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: prefill request %d continues slot %d, which is %s; set GDP_PREFILL_NEW for a new "
                         "request",
                         op, i, s, used[s] == 2 ? "named earlier in this step" : "not in use");
        }
        used[s] = 2;
        new_slots[i] = s;
        if (r->flags & GDP_PREFILL_RESTORE) {
            if (!(r->flags & GDP_PREFILL_NEW))
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: prefill request %d restores a snapshot without GDP_PREFILL_NEW; restoring replaces a "
                         "new request's zeroed state",
                         op, i);
            if (r->restore_snapshot < 0 || r->restore_snapshot >= cc->n_snapshots)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: prefill request %d restores snapshot %d, outside [0, %d) (the cache's n_snapshots)", op,
                         i, r->restore_snapshot, cc->n_snapshots);
            if (!cache->snap_saved[r->restore_snapshot])
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: prefill request %d restores snapshot %d, which no step has saved", op, i,
                         r->restore_snapshot);
        }
        if (r->flags & GDP_PREFILL_SAVE) {
            if (r->save_snapshot < 0 || r->save_snapshot >= cc->n_snapshots)
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: prefill request %d saves into snapshot %d, outside [0, %d) (the cache's n_snapshots)",
                         op, i, r->save_snapshot, cc->n_snapshots);
            if (r->save_offset < 0 || r->save_offset > r->n_tokens ||
                (r->save_offset % GDP_CHUNK_SIZE != 0 && r->save_offset != r->n_tokens))
                GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                         "%s: prefill request %d saves at offset %d of its %d tokens; the offset must be a multiple "
                         "of %d or the slice's end",
                         op, i, r->save_offset, r->n_tokens, GDP_CHUNK_SIZE);
            for (int32_t e = 0; e < i; e++)
                if ((d->prefill[e].flags & GDP_PREFILL_SAVE) && d->prefill[e].save_snapshot == r->save_snapshot)
                    GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                             "%s: prefill requests %d and %d both save into snapshot %d", op, e, i, r->save_snapshot);
        }
    }
    /* Decode requests: in use, named once. */
    for (int32_t i = 0; i < d->decode_count; i++) {
        const int32_t s = d->decode_slots[i];
        SLOT_RANGE("decode request", i, s);
        if (used[s] != 1)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: decode request %d names slot %d, which is %s", op, i, s,
                     used[s] == 2 ? "named earlier in this step (a slot runs one request per step)"
                                  : "not in use (claim it with a new prefill request first)");
        used[s] = 2;
    }
#undef SLOT_RANGE
    if (tokens > INT32_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %lld prefill tokens overflow int32; split the step", op,
                 (long long)tokens);
    /* The bucket. */
    char why[256];
    if (d->bucket != GDP_BUCKET_AUTO) {
        if (d->bucket < 0 || d->bucket >= p->cfg.n_buckets)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: bucket %d is outside [0, %d)", op, d->bucket, p->cfg.n_buckets);
        const gdp_step_bucket *b = &p->buckets[d->bucket];
        if (!fits_bucket(b, d, tokens, why, sizeof why))
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: the step does not fit its bucket %d (decode %d, prefill %d, tokens %d): %s; use a larger "
                     "bucket or GDP_BUCKET_AUTO, or move requests to the next step",
                     op, d->bucket, b->decode_count, b->prefill_count, b->token_count, why);
        *bucket = d->bucket;
    } else {
        int32_t best = -1;
        for (int32_t b = 0; b < p->cfg.n_buckets; b++)
            if (fits_bucket(&p->buckets[b], d, tokens, NULL, 0) &&
                (best < 0 || p->buckets[b].token_count < p->buckets[best].token_count))
                best = b;
        if (best < 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: the step (%d decode requests x S = %d, %d prefill requests, %lld prefill tokens) fits none "
                     "of the %d buckets; split it over several steps or add a bucket",
                     op, d->decode_count, S, d->prefill_count, (long long)tokens, p->cfg.n_buckets);
        *bucket = best;
    }
    *prefill_tokens = tokens;
    return GDP_STATUS_SUCCESS;
}

/* ---- building ------------------------------------------------------------------------- */

/* Carves `n` words out of the metadata buffer. */
static int32_t *take(int32_t **cursor, size_t n) {
    int32_t *p = *cursor;
    *cursor += n;
    return p;
}

static void point_arrays(gdp_step_arrays *a, const int32_t *base, const size_t *offs) {
    const int32_t **fields[] = {&a->decode_slots,   &a->prefill_slots,  &a->cu_seqlens,     &a->chunk_indices,
                                &a->chunk_indices_dp, &a->chunk_offsets, &a->seq_idx,        &a->conv_seq_idx,
                                &a->conv_seq_start, &a->save_snapshot,  &a->save_offset,    &a->save_chunk_row,
                                &a->save_cu_seqlens};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        *fields[i] = base + offs[i];
}

static bool env_debug(void) {
    const char *v = getenv("GDP_PLAN_DEBUG");
    return v != NULL && v[0] != 0 && strcmp(v, "0") != 0;
}

/* The sizes of one validated step in its bucket (step 2 of gdp_plan_build). */
typedef struct step_shape {
    int32_t bucket;         /* resolved bucket index */
    int32_t S;              /* tokens per decode request */
    int32_t pd, pp;         /* the bucket's padded decode and prefill request counts */
    int32_t offset;         /* first prefill token row: pd * S */
    int32_t rows;           /* prefill token rows of the bucket */
    int64_t tokens;         /* real prefill tokens of the step */
    int64_t nc, ncdp;       /* chunk descriptor capacities for rows and pp */
} step_shape;

/* Where each array of one step's metadata lies in its host buffer (step 3's layout): the
 * header, the arrays in the order of gdp_step_arrays, the fills, then the resolved step. */
typedef struct meta_layout {
    int32_t *base;
    int32_t *decode_slots, *prefill_slots, *cu, *ci, *cidp, *offsets, *seq_idx, *conv_idx, *conv_start;
    int32_t *save_snap, *save_off, *save_row, *save_cu, *fills;
    int32_t *r_decode, *r_release;
    gdp_prefill_request *r_prefill;
    gdp_draft_accept *r_accept;
    size_t arrays_end; /* words the device reads: arrays and fills */
    size_t used_words; /* words of the whole layout */
} meta_layout;

/* Step 1: validates the step against the cache and the buckets (both only read), resolving
 * the new requests' slots into new_slots, and makes every rank agree on the outcome. */
static gdp_status_t validate_and_agree(gdp_plan_t plan, struct gdp_cache *cache, gdp_comm_t comm, int32_t *new_slots,
                                       int32_t *bucket, int64_t *tokens, const char *op) {
    gdp_status_t st = validate_step(plan, cache, &plan->step, new_slots, bucket, tokens, op);
    if (comm != NULL) {
        /* The step's one agreement: a rank whose cache diverged (or whose validation failed
         * for any reason) fails every rank here, before any rank writes anything or waits in
         * a collective (the debug hash all-reduce below, the layers' collectives). */
        gdp_status_t agreed = gdp_comm_agree(comm, st);
        if (st == GDP_STATUS_SUCCESS)
            st = agreed;
    }
    return st;
}

/* Step 2: the padded sizes of the step in its bucket and the chunk descriptor capacities. */
static gdp_status_t shape_step(const struct gdp_plan *plan, int32_t bucket, int64_t tokens, step_shape *sh) {
    const gdp_step_bucket *b = &plan->buckets[bucket];
    sh->bucket = bucket;
    sh->tokens = tokens;
    sh->S = plan->step.decode_tokens;
    sh->pd = b->decode_count;
    sh->pp = b->prefill_count;
    sh->offset = sh->pd * sh->S;
    sh->rows = b->token_count - sh->offset;
    sh->nc = 0, sh->ncdp = 0;
    return gdp_max_chunk_counts(sh->rows, sh->pp, plan->cfg.num_householder, &sh->nc, &sh->ncdp);
}

/* Step 3a: waits until the upload that last read host buffer `which` (two builds ago) has
 * finished, so this build may rewrite it. */
static gdp_status_t wait_for_buffer(gdp_plan_t plan, int32_t which, const char *op) {
#ifdef GDP_HAVE_CUDA
    if (plan->upload_done[which] != NULL) {
        const cudaError_t err = cudaEventSynchronize((cudaEvent_t)plan->upload_done[which]);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "%s: waiting for the metadata upload of an earlier step failed", op);
    }
#else
    (void)plan, (void)which, (void)op;
#endif
    return GDP_STATUS_SUCCESS;
}

/* Step 3b: carves the step's arrays out of the buffer at `base`. Offsets are relative to the
 * buffer start (host and device alike). */
static gdp_status_t lay_out_buffer(const struct gdp_plan *plan, int32_t *base, const step_shape *sh, meta_layout *L,
                                   const char *op) {
    const gdp_step_desc *d = &plan->step;
    const size_t pd = (size_t)sh->pd, pp = (size_t)sh->pp, rows = (size_t)sh->rows;
    int32_t *cur = base + M_HEADER_WORDS;
    L->base = base;
    L->decode_slots = take(&cur, pd), L->prefill_slots = take(&cur, pp);
    L->cu = take(&cur, pp + 1), L->ci = take(&cur, 2 * (size_t)sh->nc), L->cidp = take(&cur, 2 * (size_t)sh->ncdp);
    L->offsets = take(&cur, pp + 1), L->seq_idx = take(&cur, rows);
    L->conv_idx = take(&cur, rows), L->conv_start = take(&cur, rows);
    L->save_snap = take(&cur, pp), L->save_off = take(&cur, pp);
    L->save_row = take(&cur, pp), L->save_cu = take(&cur, 2 * pp);
    L->fills = take(&cur, ((size_t)d->accept_count + (size_t)d->prefill_count) * FILL_WORDS);
    L->arrays_end = (size_t)(cur - base);
    L->r_decode = take(&cur, (size_t)d->decode_count);
    L->r_prefill = (gdp_prefill_request *)take(&cur, (size_t)d->prefill_count * PREFILL_WORDS);
    L->r_release = take(&cur, (size_t)d->release_count);
    L->r_accept = (gdp_draft_accept *)take(&cur, (size_t)d->accept_count * ACCEPT_WORDS);
    L->used_words = (size_t)(cur - base);
    if (L->used_words > plan->meta_words) /* sized at init for the largest bucket: a bug if hit */
        GDP_FAIL(GDP_STATUS_INTERNAL_ERROR, "%s: metadata needs %zu words, the buffer holds %zu", op, L->used_words,
                 plan->meta_words);
    return GDP_STATUS_SUCCESS;
}

/* Step 3c: the slot arrays, cu_seqlens, chunk descriptors, per-token sequence and conv
 * metadata, and the snapshot saves (counted into *saves and *chunk_saves). Padding requests
 * get slot -1 and empty slices. */
static gdp_status_t write_token_arrays(const struct gdp_plan *plan, const int32_t *new_slots, const step_shape *sh,
                                       const meta_layout *L, int32_t *saves_out, int32_t *chunk_saves_out) {
    const gdp_step_desc *d = &plan->step;
    const int32_t pd = sh->pd, pp = sh->pp, rows = sh->rows;
    int32_t *cu = L->cu;
    for (int32_t i = 0; i < pd; i++)
        L->decode_slots[i] = i < d->decode_count ? d->decode_slots[i] : -1;
    cu[0] = 0;
    for (int32_t i = 0; i < pp; i++) {
        L->prefill_slots[i] = i < d->prefill_count ? new_slots[i] : -1;
        cu[i + 1] = cu[i] + (i < d->prefill_count ? d->prefill[i].n_tokens : 0); /* padding repeats the last */
    }
    int64_t nc_out = 0, ncdp_out = 0;
    GDP_CHECK(gdp_build_chunk_descriptors(cu, pp, plan->cfg.num_householder, rows, L->ci, L->cidp, L->offsets,
                                          &nc_out, &ncdp_out));
    for (int32_t t = 0; t < rows; t++)
        L->seq_idx[t] = -1, L->conv_idx[t] = 0, L->conv_start[t] = 0;
    int32_t saves = 0, chunk_saves = 0;
    for (int32_t i = 0; i < pp; i++) {
        L->save_snap[i] = -1, L->save_off[i] = 0, L->save_row[i] = -1, L->save_cu[2 * i] = 0, L->save_cu[2 * i + 1] = 0;
        if (i >= d->prefill_count)
            continue;
        for (int32_t t = cu[i]; t < cu[i + 1]; t++)
            L->seq_idx[t] = i, L->conv_idx[t] = i, L->conv_start[t] = cu[i];
        const gdp_prefill_request *r = &d->prefill[i];
        if (r->flags & GDP_PREFILL_SAVE) {
            saves++;
            L->save_snap[i] = r->save_snapshot;
            L->save_off[i] = r->save_offset;
            L->save_cu[2 * i + 1] = r->save_offset;
            if (r->save_offset < r->n_tokens) {
                L->save_row[i] = L->offsets[i] + r->save_offset / GDP_CHUNK_SIZE;
                chunk_saves++;
            }
        }
    }
    *saves_out = saves, *chunk_saves_out = chunk_saves;
    return GDP_STATUS_SUCCESS;
}

/* Step 3d: the slot fills, in the order gdp_cache_apply_step applies them (accepts, then new
 * requests); a later operation on the same slot replaces an earlier one (an accepted slot
 * released and claimed again in this step ends up zeroed or restored), so the fills name
 * distinct slots and the device may run them in parallel. Returns the number of fills. */
static int32_t write_slot_fills(const gdp_step_desc *d, const struct gdp_cache *cache, const int32_t *new_slots,
                                int32_t *fills) {
    int32_t n_fill = 0;
    for (int32_t k = 0; k < d->accept_count + d->prefill_count; k++) {
        int32_t slot, source, row;
        if (k < d->accept_count) {
            const gdp_draft_accept *a = &d->accept[k];
            /* Row [slot, s] of a draft step of S tokens is row slot * S + s of the buffers. */
            slot = a->slot, source = GDP_FILL_FROM_DRAFT;
            row = a->slot * cache->draft_tokens[a->slot] + (a->n_accepted - 1);
        } else {
            const gdp_prefill_request *r = &d->prefill[k - d->accept_count];
            if (!(r->flags & GDP_PREFILL_NEW))
                continue;
            slot = new_slots[k - d->accept_count];
            source = (r->flags & GDP_PREFILL_RESTORE) ? GDP_FILL_FROM_SNAPSHOT : GDP_FILL_ZERO;
            row = (r->flags & GDP_PREFILL_RESTORE) ? r->restore_snapshot : 0;
        }
        int32_t at = n_fill;
        for (int32_t e = 0; e < n_fill; e++)
            if (fills[FILL_WORDS * e] == slot)
                at = e;
        fills[FILL_WORDS * at] = slot, fills[FILL_WORDS * at + 1] = source, fills[FILL_WORDS * at + 2] = row;
        if (at == n_fill)
            n_fill++;
    }
    return n_fill;
}

/* Step 3e: the resolved step (GDP_SLOT_AUTO replaced by the slots validation chose), kept in
 * the buffer after the device's part so that it lives as long as the metadata. */
static void write_resolved_step(gdp_plan_t plan, const int32_t *new_slots, int32_t bucket, const meta_layout *L) {
    const gdp_step_desc *d = &plan->step;
    for (int32_t i = 0; i < d->decode_count; i++)
        L->r_decode[i] = d->decode_slots[i];
    for (int32_t i = 0; i < d->prefill_count; i++) {
        L->r_prefill[i] = d->prefill[i];
        L->r_prefill[i].slot = new_slots[i];
    }
    for (int32_t i = 0; i < d->release_count; i++)
        L->r_release[i] = d->release_slots[i];
    for (int32_t i = 0; i < d->accept_count; i++)
        L->r_accept[i] = d->accept[i];
    plan->resolved = *d;
    plan->resolved.decode_slots = L->r_decode;
    plan->resolved.prefill = L->r_prefill;
    plan->resolved.release_slots = L->r_release;
    plan->resolved.accept = L->r_accept;
    plan->resolved.bucket = bucket;
}

/* The buffer offsets of the arrays, in the order of gdp_step_arrays (point_arrays). */
static void layout_offsets(const meta_layout *L, size_t offs[13]) {
    const int32_t *arrays[13] = {L->decode_slots, L->prefill_slots, L->cu,         L->ci,        L->cidp,
                                 L->offsets,      L->seq_idx,       L->conv_idx,   L->conv_start, L->save_snap,
                                 L->save_off,     L->save_row,      L->save_cu};
    for (int i = 0; i < 13; i++)
        offs[i] = (size_t)(arrays[i] - L->base);
}

/* Step 3f: the buffer's header words and the caller's gdp_step_metadata (host arrays). */
static void write_header_and_metadata(gdp_plan_t plan, const struct gdp_cache *cache, const step_shape *sh,
                                      const meta_layout *L, int32_t saves, int32_t chunk_saves, int32_t n_fill) {
    const gdp_step_desc *d = &plan->step;
    const gdp_step_bucket *b = &plan->buckets[sh->bucket];
    const int32_t M = plan->cfg.num_householder;
    const int32_t header[M_HEADER_WORDS] = {
        [M_MAGIC] = META_MAGIC,        [M_BUCKET] = sh->bucket,      [M_DECODE_COUNT] = d->decode_count,
        [M_DECODE_TOKENS] = sh->S,     [M_PREFILL_COUNT] = d->prefill_count, [M_PD] = sh->pd,
        [M_PP] = sh->pp,               [M_TOKENS] = b->token_count,  [M_OFFSET] = sh->offset,
        [M_ROWS] = sh->rows,           [M_PREFILL_TOKENS] = (int32_t)sh->tokens, [M_SAVES] = saves,
        [M_CHUNK_SAVES] = chunk_saves, [M_NC] = (int32_t)sh->nc,     [M_NCDP] = (int32_t)sh->ncdp,
        [M_M] = M,                     [M_RELEASE_COUNT] = d->release_count, [M_ACCEPT_COUNT] = d->accept_count,
        [M_FILL_COUNT] = n_fill,       [M_FILL_OFFSET] = (int32_t)(L->fills - L->base),
    };
    memcpy(L->base, header, sizeof header);

    gdp_step_metadata *m = &plan->meta;
    memset(m, 0, sizeof *m);
    m->bucket = sh->bucket;
    m->decode_count = d->decode_count;
    m->decode_tokens = sh->S;
    m->prefill_count = d->prefill_count;
    m->padded_decode_count = sh->pd;
    m->padded_prefill_count = sh->pp;
    m->padded_token_count = b->token_count;
    m->prefill_token_offset = sh->offset;
    m->prefill_rows = sh->rows;
    m->prefill_tokens = (int32_t)sh->tokens;
    m->save_count = saves;
    m->chunk_state_saves = chunk_saves;
    m->num_chunks = sh->nc;
    m->num_chunks_dp = sh->ncdp;
    m->num_householder = M;
    size_t offs[13];
    layout_offsets(L, offs);
    point_arrays(&m->host, L->base, offs);
    m->host_buffer = L->base;
    m->buffer_bytes = L->used_words * sizeof(int32_t);
    m->step = &plan->resolved;
    m->cache_id = cache;
    m->cache_generation = cache->generation;
}

/* Step 3: writes the validated step into host buffer `which`. */
static gdp_status_t write_metadata(gdp_plan_t plan, const struct gdp_cache *cache, const int32_t *new_slots,
                                   const step_shape *sh, int32_t which, meta_layout *L, const char *op) {
    GDP_CHECK(wait_for_buffer(plan, which, op));
    plan->have_meta = 0;
    GDP_CHECK(lay_out_buffer(plan, plan->meta_bufs[which], sh, L, op));
    int32_t saves = 0, chunk_saves = 0;
    GDP_CHECK(write_token_arrays(plan, new_slots, sh, L, &saves, &chunk_saves));
    const int32_t n_fill = write_slot_fills(&plan->step, cache, new_slots, L->fills);
    write_resolved_step(plan, new_slots, sh->bucket, L);
    write_header_and_metadata(plan, cache, sh, L, saves, chunk_saves, n_fill);
    return GDP_STATUS_SUCCESS;
}

/* Step 4: one host-to-device copy of the arrays and fills (CUDA), queued on the stream (the
 * device reads it after the steps queued before), and the device pointers of the metadata;
 * the CPU reads the host buffer. */
static gdp_status_t upload_metadata(gdp_plan_t plan, int32_t which, const meta_layout *L, const char *op) {
    gdp_step_metadata *m = &plan->meta;
    if (plan->meta_dev != NULL) {
#ifdef GDP_HAVE_CUDA
        cudaStream_t s = (cudaStream_t)plan->ctx->stream;
        cudaError_t err =
            cudaMemcpyAsync(plan->meta_dev, L->base, L->arrays_end * sizeof(int32_t), cudaMemcpyHostToDevice, s);
        if (err == cudaSuccess)
            err = cudaEventRecord((cudaEvent_t)plan->upload_done[which], s);
        if (err != cudaSuccess)
            GDP_CUDA_FAIL(err, "%s: queueing the metadata upload (%zu bytes) failed", op, L->arrays_end * sizeof(int32_t));
#else
        (void)which, (void)op;
#endif
        size_t offs[13];
        layout_offsets(L, offs);
        point_arrays(&m->device, (const int32_t *)plan->meta_dev, offs);
    } else {
        m->device = m->host;
    }
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_plan_build(gdp_plan_t plan, struct gdp_cache *cache, gdp_comm_t comm,
                            const gdp_step_metadata **meta_out) {
    static const char *op = "gdp_plan_build";
    GDP_CHECK(check_plan(plan, op));
    GDP_CHECK(gdp_cache_check_handle(cache, op));
    if (meta_out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: meta out-pointer is NULL", op);
    if (!plan->have_step)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: the plan holds no step; call gdp_plan_bcast first", op);
    if (cache->ctx->backend != plan->ctx->backend)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the cache's backend (%d) differs from the plan's (%d)", op,
                 (int)cache->ctx->backend, (int)plan->ctx->backend);
    const bool debug = plan->cfg.debug_check || env_debug();
    const gdp_step_desc *d = &plan->step;

    int32_t new_slots_stack[64];
    int32_t *new_slots = d->prefill_count <= 64 ? new_slots_stack
                                                : gdp_calloc((size_t)d->prefill_count, sizeof(int32_t), "slot list");
    if (new_slots == NULL)
        return GDP_STATUS_SYSTEM_ERROR;
    int32_t bucket = -1;
    int64_t tokens = 0;
    step_shape sh;
    meta_layout L;
    const int32_t which = plan->meta_next;
    /* 1. Validate (the cache and this plan's metadata are only read); 2. sizes; 3. write. */
    gdp_status_t st = validate_and_agree(plan, cache, comm, new_slots, &bucket, &tokens, op);
    if (st == GDP_STATUS_SUCCESS)
        st = shape_step(plan, bucket, tokens, &sh);
    if (st == GDP_STATUS_SUCCESS)
        st = write_metadata(plan, cache, new_slots, &sh, which, &L, op);
    if (new_slots != new_slots_stack)
        free(new_slots);
    GDP_CHECK(st);
    /* 4. Upload. */
    GDP_CHECK(upload_metadata(plan, which, &L, op));
    plan->meta_next = which ^ 1;
    plan->have_meta = 1;

    /* 5. Debug: every rank must have built the same bytes. */
    if (debug && comm != NULL)
        GDP_CHECK(gdp_plan_check_consistent(&plan->meta, comm));
    *meta_out = &plan->meta;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_plan_check_token_split(gdp_plan_t plan, int32_t ranks) {
    static const char *op = "gdp_plan_check_token_split";
    GDP_CHECK(check_plan(plan, op));
    if (ranks < 1)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: ranks is %d, must be >= 1 (cp, or tp * cp with sequence parallel)",
                 op, ranks);
    for (int32_t b = 0; b < plan->cfg.n_buckets; b++) {
        const int32_t rows = plan->buckets[b].token_count;
        if (rows % ranks != 0)
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                     "%s: bucket %d has %d token rows, which do not split evenly over %d ranks; pad its token_count "
                     "to %d (a multiple of %d)",
                     op, b, rows, ranks, (rows / ranks + 1) * ranks, ranks);
    }
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_plan_check_consistent(const gdp_step_metadata *meta, gdp_comm_t comm) {
    static const char *op = "gdp_plan_check_consistent";
    if (meta == NULL || meta->host_buffer == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: meta is NULL; pass the metadata gdp_plan_build returned", op);
    if (comm == NULL)
        return GDP_STATUS_SUCCESS; /* one rank agrees with itself */
    return gdp_comm_check_consistent(comm, meta->host_buffer, meta->buffer_bytes,
                                     "the step metadata (slots, cu_seqlens, chunk descriptors, conv metadata)");
}

