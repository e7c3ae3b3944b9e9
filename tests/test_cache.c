/*
 * test_cache.c: the distributed state cache on one process (CPU backend): its config from
 * a TP shard, bad configs, the views' shapes and dtypes, and the slot operations a step
 * applies: new slots claimed (GDP_SLOT_AUTO = the lowest free) and zeroed on every layer,
 * releases, draft-token rollback (the state after the n_accepted-th token copied back),
 * prefix snapshots restored into a new slot, the bookkeeping queries, and misuse (a step
 * applied twice, metadata of another cache) refused with nothing modified; the swap API
 * (a slot out to host memory and back into another slot bit for bit, bad calls refused with
 * nothing modified). The layer's
 * use of these buffers is tested in test_layer_tp.
 */
#include <string.h>

#include "gdp/cache.h"
#include "gdp/plan.h"
#include "test_common.h"

#define N_SLOTS 6
#define N_SNAPSHOTS 2
#define MAX_DRAFT 3

static gdp_ctx_t g_ctx;

/* A small stack: 2 layers, H = 4, G = 2, P = 8, N = 16, M = 2, W = 4. */
static gdp_layer_config small_config(void) {
    gdp_layer_config c;
    gdp_layer_config_default(&c);
    c.hidden_size = 32;
    c.num_heads = 4;
    c.num_groups = 2;
    c.head_dim = 8;
    c.state_dim = 16;
    c.num_householder = 2;
    c.num_layers = 2;
    return c;
}

static size_t ssm_slot_bytes(const gdp_cache_config *c) {
    return (size_t)c->num_heads * c->state_dim * c->head_dim * gdp_dtype_size(c->ssm_dtype);
}
static size_t conv_slot_bytes(const gdp_cache_config *c) {
    return (size_t)c->conv_dim * c->conv_width * gdp_dtype_size(c->conv_dtype);
}

/* Fills every slot of every layer with a distinct non-zero pattern. */
static void scribble(gdp_cache_t cache, const gdp_cache_config *c, uint64_t seed) {
    test_rng r;
    test_rng_seed(&r, seed);
    for (int32_t l = 0; l < c->num_layers; l++) {
        gdp_tensor ssm, conv;
        gdp_cache_state_views(cache, l, &ssm, &conv);
        test_fill_uniform(&ssm, &r, 0.5, 1.5);
        test_fill_uniform(&conv, &r, 0.5, 1.5);
    }
}

/* Host copy of every layer's ssm and conv buffers, for "unchanged" checks. */
typedef struct { unsigned char *bytes[2][4]; size_t n[2]; } snapshot_copy;

static snapshot_copy copy_states(gdp_cache_t cache, const gdp_cache_config *c) {
    snapshot_copy s = {0};
    s.n[0] = ssm_slot_bytes(c) * c->n_slots;
    s.n[1] = conv_slot_bytes(c) * c->n_slots;
    for (int32_t l = 0; l < c->num_layers; l++) {
        gdp_tensor ssm, conv;
        gdp_cache_state_views(cache, l, &ssm, &conv);
        s.bytes[0][l] = malloc(s.n[0]);
        s.bytes[1][l] = malloc(s.n[1]);
        memcpy(s.bytes[0][l], ssm.data, s.n[0]);
        memcpy(s.bytes[1][l], conv.data, s.n[1]);
    }
    return s;
}

static void free_copy(snapshot_copy *s, int32_t layers) {
    for (int32_t l = 0; l < layers; l++)
        free(s->bytes[0][l]), free(s->bytes[1][l]);
}

/* Slot `slot` of every layer: equal to `want` (NULL: all zero) or to the copy's bytes. */
static bool slot_is(gdp_cache_t cache, const gdp_cache_config *c, int32_t slot, const snapshot_copy *want,
                    bool zero) {
    const size_t sb = ssm_slot_bytes(c), cb = conv_slot_bytes(c);
    for (int32_t l = 0; l < c->num_layers; l++) {
        gdp_tensor ssm, conv;
        gdp_cache_state_views(cache, l, &ssm, &conv);
        const unsigned char *s = (const unsigned char *)ssm.data + slot * sb;
        const unsigned char *v = (const unsigned char *)conv.data + slot * cb;
        for (size_t i = 0; i < sb; i++)
            if (s[i] != (zero ? 0 : want->bytes[0][l][slot * sb + i]))
                return false;
        for (size_t i = 0; i < cb; i++)
            if (v[i] != (zero ? 0 : want->bytes[1][l][slot * cb + i]))
                return false;
    }
    return true;
}

static int32_t lowest_free(gdp_cache_t cache, int32_t n_slots) {
    for (int32_t s = 0; s < n_slots; s++) {
        int32_t used = 1;
        gdp_cache_slot_in_use(cache, s, &used);
        if (!used)
            return s;
    }
    return -1;
}

static gdp_plan_t make_plan(int32_t M) {
    const gdp_step_bucket buckets[] = {{4, 4, 128}};
    gdp_plan_config pc = {.num_householder = M, .n_slots = N_SLOTS, .max_decode_tokens = MAX_DRAFT,
                          .n_buckets = 1, .buckets = buckets};
    gdp_plan_t plan = NULL;
    CHECK_OK(gdp_plan_init(&plan, g_ctx, &pc));
    return plan;
}

static void test_config(void) {
    gdp_layer_config lc = small_config();
    for (int32_t tp = 1; tp <= 2; tp++) {
        gdp_tp_shard shard;
        CHECK_OK(gdp_tp_shard_init(&shard, &lc, tp - 1, tp));
        gdp_cache_config c;
        CHECK_OK(gdp_cache_config_init(&c, &shard, N_SLOTS));
        CHECK(c.num_layers == lc.num_layers && c.n_slots == N_SLOTS && c.num_heads == shard.num_heads &&
                  c.state_dim == lc.state_dim && c.head_dim == lc.head_dim && c.conv_dim == shard.conv_dim &&
                  c.conv_width == lc.conv_width,
              "tp %d: config (%d layers, %d slots, H %d, N %d, P %d, C %d, W %d) does not follow the shard", tp,
              c.num_layers, c.n_slots, c.num_heads, c.state_dim, c.head_dim, c.conv_dim, c.conv_width);
        CHECK(c.ssm_dtype == GDP_DTYPE_FP32 && c.conv_dtype == GDP_DTYPE_FP32 && c.max_draft_tokens == 0 &&
                  c.n_snapshots == 0,
              "tp %d: defaults: ssm %s conv %s draft %d snapshots %d", tp, gdp_dtype_name(c.ssm_dtype),
              gdp_dtype_name(c.conv_dtype), c.max_draft_tokens, c.n_snapshots);
        CHECK_STATUS(gdp_cache_config_init(&c, &shard, 0), GDP_STATUS_INVALID_ARGUMENT);
    }
    printf("config: from TP shards at tp 1 and 2, defaults fp32, no drafts/snapshots\n");
}

static void test_bad_init(const gdp_cache_config *good) {
    struct { const char *what; gdp_cache_config c; const char *needle; } cases[6];
    for (int i = 0; i < 6; i++)
        cases[i].c = *good;
    cases[0].what = "zero slots", cases[0].c.n_slots = 0, cases[0].needle = "n_slots";
    cases[1].what = "fp16 ssm state", cases[1].c.ssm_dtype = GDP_DTYPE_FP16, cases[1].needle = "ssm_dtype";
    cases[2].what = "int32 conv state", cases[2].c.conv_dtype = GDP_DTYPE_INT32, cases[2].needle = "conv_dtype";
    cases[3].what = "conv width 1", cases[3].c.conv_width = 1, cases[3].needle = "conv_width";
    cases[4].what = "negative snapshots", cases[4].c.n_snapshots = -1, cases[4].needle = "n_snapshots";
    cases[5].what = "state dim 300", cases[5].c.state_dim = 300, cases[5].needle = "256";
    for (int i = 0; i < 6; i++) {
        gdp_cache_t cache = (gdp_cache_t)&cases[i]; /* must be reset to NULL */
        CHECK_STATUS(gdp_cache_init(&cache, g_ctx, &cases[i].c), GDP_STATUS_INVALID_ARGUMENT);
        CHECK(cache == NULL, "%s: *out not reset on failure", cases[i].what);
        CHECK(strstr(gdp_last_error(), cases[i].needle) != NULL, "%s: message '%s' does not name %s", cases[i].what,
              gdp_last_error(), cases[i].needle);
    }
    CHECK_STATUS(gdp_cache_free(NULL), GDP_STATUS_SUCCESS);
    printf("bad configs: %d refused with the field named\n", 6);
}

static void test_views(gdp_cache_t cache, const gdp_cache_config *c) {
    gdp_tensor ssm, conv;
    CHECK_OK(gdp_cache_state_views(cache, 1, &ssm, &conv));
    CHECK(ssm.ndim == 4 && ssm.shape[0] == c->n_slots && ssm.shape[1] == c->num_heads &&
              ssm.shape[2] == c->state_dim && ssm.shape[3] == c->head_dim && ssm.dtype == c->ssm_dtype,
          "ssm view shape/dtype wrong");
    CHECK(conv.ndim == 3 && conv.shape[0] == c->n_slots && conv.shape[1] == c->conv_dim &&
              conv.shape[2] == c->conv_width && conv.dtype == c->conv_dtype,
          "conv view shape/dtype wrong");
    CHECK_STATUS(gdp_cache_state_views(cache, c->num_layers, &ssm, &conv), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_OK(gdp_cache_draft_views(cache, 0, 2, &ssm, &conv));
    CHECK(ssm.ndim == 5 && ssm.shape[0] == c->n_slots && ssm.shape[1] == 2 && conv.ndim == 4 && conv.shape[1] == 2,
          "draft views for S = 2 have the wrong shapes");
    CHECK_STATUS(gdp_cache_draft_views(cache, 0, c->max_draft_tokens + 1, &ssm, &conv), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_OK(gdp_cache_snapshot_views(cache, 0, &ssm, &conv));
    CHECK(ssm.shape[0] == c->n_snapshots && conv.shape[0] == c->n_snapshots, "snapshot views have the wrong shapes");
    /* views of different layers are different memory */
    gdp_tensor ssm1;
    CHECK_OK(gdp_cache_state_views(cache, 0, &ssm, NULL));
    CHECK_OK(gdp_cache_state_views(cache, 1, &ssm1, NULL));
    CHECK(ssm.data != ssm1.data, "layers 0 and 1 share their ssm buffer");
    int32_t n_free = -1;
    CHECK_OK(gdp_cache_free_slot_count(cache, &n_free));
    CHECK(n_free == c->n_slots, "a fresh cache has %d free slots of %d", n_free, c->n_slots);
    printf("views: state, draft (S <= %d) and snapshot shapes; a fresh cache has every slot free\n",
           c->max_draft_tokens);
}

static void test_slot_operations(gdp_cache_t cache, const gdp_cache_config *c) {
    gdp_plan_t plan = make_plan(2);
    scribble(cache, c, 7);

    /* Step 1: two new requests on GDP_SLOT_AUTO take the lowest free slots, zeroed. */
    int32_t expect0 = lowest_free(cache, c->n_slots);
    snapshot_copy before = copy_states(cache, c);
    gdp_prefill_request p1[2] = {{.slot = GDP_SLOT_AUTO, .n_tokens = 5, .flags = GDP_PREFILL_NEW},
                                 {.slot = GDP_SLOT_AUTO, .n_tokens = 3, .flags = GDP_PREFILL_NEW}};
    gdp_step_desc d1 = {.prefill_count = 2, .prefill = p1, .bucket = GDP_BUCKET_AUTO};
    const gdp_step_metadata *m = test_step_local(plan, cache, &d1);
    const int32_t a = m ? m->step->prefill[0].slot : -1, b = m ? m->step->prefill[1].slot : -1;
    CHECK(a == expect0 && b > a, "new slots %d, %d; expected the lowest free (%d) and the next", a, b, expect0);
    CHECK(m && m->host.prefill_slots[0] == a && m->host.prefill_slots[1] == b, "metadata slots differ from the step");
    CHECK(slot_is(cache, c, a, NULL, true) && slot_is(cache, c, b, NULL, true), "new slots not zeroed on every layer");
    for (int32_t s = 0; s < c->n_slots; s++)
        if (s != a && s != b)
            CHECK(slot_is(cache, c, s, &before, false), "slot %d changed though the step did not name it", s);
    int32_t used = 0, n_free = 0;
    CHECK_OK(gdp_cache_slot_in_use(cache, a, &used));
    CHECK(used == 1, "slot %d not in use after its claim", a);
    CHECK_OK(gdp_cache_free_slot_count(cache, &n_free));
    CHECK(n_free == c->n_slots - 2, "%d free slots after 2 claims of %d", n_free, c->n_slots);
    free_copy(&before, c->num_layers);

    /* The same step applied twice: refused, nothing modified. */
    scribble(cache, c, 8);
    before = copy_states(cache, c);
    CHECK_STATUS(gdp_cache_apply_step(cache, m), GDP_STATUS_INVALID_USAGE);
    for (int32_t s = 0; s < c->n_slots; s++)
        CHECK(slot_is(cache, c, s, &before, false), "slot %d changed by a refused apply", s);
    free_copy(&before, c->num_layers);

    /* Step 2: release a, claim an explicit free slot, decode b with S = 3 (a draft step). */
    int32_t explicit_slot = -1;
    for (int32_t s = c->n_slots - 1; s >= 0; s--) {
        CHECK_OK(gdp_cache_slot_in_use(cache, s, &used));
        if (!used) {
            explicit_slot = s;
            break;
        }
    }
    gdp_prefill_request p2 = {.slot = explicit_slot, .n_tokens = 4, .flags = GDP_PREFILL_NEW};
    const int32_t rel[1] = {a}, dec[1] = {b};
    gdp_step_desc d2 = {.decode_count = 1, .decode_tokens = 3, .decode_slots = dec, .prefill_count = 1,
                        .prefill = &p2, .release_count = 1, .release_slots = rel, .bucket = GDP_BUCKET_AUTO};
    before = copy_states(cache, c);
    m = test_step_local(plan, cache, &d2);
    CHECK_OK(gdp_cache_slot_in_use(cache, a, &used));
    CHECK(used == 0, "released slot %d still in use", a);
    CHECK(m && m->step->prefill[0].slot == explicit_slot, "explicit slot %d became %d", explicit_slot,
          m ? m->step->prefill[0].slot : -1);
    CHECK(slot_is(cache, c, explicit_slot, NULL, true), "explicit new slot %d not zeroed", explicit_slot);
    CHECK(slot_is(cache, c, a, &before, false), "releasing slot %d changed its bytes (release only frees)", a);
    CHECK(slot_is(cache, c, b, &before, false), "the draft step's apply changed slot %d (the layer writes it)", b);
    free_copy(&before, c->num_layers);

    /* The layer would write the draft states: write a distinct pattern per token. */
    test_rng r;
    test_rng_seed(&r, 99);
    for (int32_t l = 0; l < c->num_layers; l++) {
        gdp_tensor ds, dc;
        CHECK_OK(gdp_cache_draft_views(cache, l, 3, &ds, &dc));
        test_fill_uniform(&ds, &r, -2, 2);
        test_fill_uniform(&dc, &r, -2, 2);
    }
    /* Step 3: keep 2 of the 3 tokens: slot b gets row [b, 1] of the draft states. */
    gdp_draft_accept acc = {.slot = b, .n_accepted = 2};
    gdp_step_desc d3 = {.accept_count = 1, .accept = &acc, .bucket = GDP_BUCKET_AUTO};
    before = copy_states(cache, c);
    m = test_step_local(plan, cache, &d3);
    bool rolled = true;
    for (int32_t l = 0; l < c->num_layers; l++) {
        gdp_tensor ssm, conv, ds, dc;
        gdp_cache_state_views(cache, l, &ssm, &conv);
        gdp_cache_draft_views(cache, l, 3, &ds, &dc);
        const size_t sb = ssm_slot_bytes(c), cb = conv_slot_bytes(c);
        rolled = rolled && !memcmp((char *)ssm.data + b * sb, (char *)ds.data + (b * 3 + 1) * sb, sb) &&
                 !memcmp((char *)conv.data + b * cb, (char *)dc.data + (b * 3 + 1) * cb, cb);
    }
    CHECK(rolled, "slot %d does not hold the state after its 2nd draft token on every layer", b);
    for (int32_t s = 0; s < c->n_slots; s++)
        if (s != b)
            CHECK(slot_is(cache, c, s, &before, false), "rollback of slot %d changed slot %d", b, s);
    free_copy(&before, c->num_layers);

    /* A second accept: the draft step was consumed. Refused at build, cache untouched. */
    before = copy_states(cache, c);
    CHECK_OK(gdp_plan_bcast(plan, NULL, 0, &d3));
    CHECK_STATUS(gdp_plan_build(plan, cache, NULL, &m), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "not a draft step") != NULL, "message: %s", gdp_last_error());
    for (int32_t s = 0; s < c->n_slots; s++)
        CHECK(slot_is(cache, c, s, &before, false), "refused accept changed slot %d", s);
    free_copy(&before, c->num_layers);

    /* Step 4: a save marks the snapshot saved (the layer writes its contents). */
    int32_t saved = 1;
    CHECK_OK(gdp_cache_snapshot_saved(cache, 1, &saved));
    CHECK(saved == 0, "snapshot 1 saved before any step saved it");
    gdp_prefill_request p4 = {.slot = explicit_slot, .n_tokens = 64, .flags = GDP_PREFILL_SAVE, .save_snapshot = 1,
                              .save_offset = 64};
    gdp_step_desc d4 = {.prefill_count = 1, .prefill = &p4, .bucket = GDP_BUCKET_AUTO};
    test_step_local(plan, cache, &d4);
    CHECK_OK(gdp_cache_snapshot_saved(cache, 1, &saved));
    CHECK(saved == 1, "snapshot 1 not marked saved by the step that saves it");
    for (int32_t l = 0; l < c->num_layers; l++) {
        gdp_tensor ss, sc;
        CHECK_OK(gdp_cache_snapshot_views(cache, l, &ss, &sc));
        test_fill_uniform(&ss, &r, 3, 4);
        test_fill_uniform(&sc, &r, 3, 4);
    }
    /* Step 5: a new request restored from snapshot 1 holds its contents on every layer. */
    gdp_prefill_request p5 = {.slot = GDP_SLOT_AUTO, .n_tokens = 8, .flags = GDP_PREFILL_NEW | GDP_PREFILL_RESTORE,
                              .restore_snapshot = 1};
    gdp_step_desc d5 = {.prefill_count = 1, .prefill = &p5, .bucket = GDP_BUCKET_AUTO};
    const int32_t expect5 = lowest_free(cache, c->n_slots);
    m = test_step_local(plan, cache, &d5);
    const int32_t rs = m ? m->step->prefill[0].slot : -1;
    CHECK(rs == expect5, "restored request got slot %d, expected the lowest free %d", rs, expect5);
    bool restored = rs >= 0;
    for (int32_t l = 0; l < c->num_layers && rs >= 0; l++) {
        gdp_tensor ssm, conv, ss, sc;
        gdp_cache_state_views(cache, l, &ssm, &conv);
        gdp_cache_snapshot_views(cache, l, &ss, &sc);
        const size_t sb = ssm_slot_bytes(c), cb = conv_slot_bytes(c);
        restored = restored && !memcmp((char *)ssm.data + rs * sb, (char *)ss.data + sb, sb) &&
                   !memcmp((char *)conv.data + rs * cb, (char *)sc.data + cb, cb);
    }
    CHECK(restored, "slot %d does not hold snapshot 1 on every layer", rs);
    /* Restoring a snapshot nobody saved is refused. */
    p5.restore_snapshot = 0;
    CHECK_OK(gdp_plan_bcast(plan, NULL, 0, &d5));
    CHECK_STATUS(gdp_plan_build(plan, cache, NULL, &m), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "snapshot 0") != NULL, "message: %s", gdp_last_error());

    /* Metadata of another cache is refused. */
    gdp_cache_t other = NULL;
    CHECK_OK(gdp_cache_init(&other, g_ctx, c));
    gdp_prefill_request p6 = {.slot = GDP_SLOT_AUTO, .n_tokens = 2, .flags = GDP_PREFILL_NEW};
    gdp_step_desc d6 = {.prefill_count = 1, .prefill = &p6, .bucket = GDP_BUCKET_AUTO};
    CHECK_OK(gdp_plan_bcast(plan, NULL, 0, &d6));
    CHECK_OK(gdp_plan_build(plan, other, NULL, &m));
    int32_t free_before = 0, free_after = 0;
    CHECK_OK(gdp_cache_free_slot_count(cache, &free_before));
    CHECK_STATUS(gdp_cache_apply_step(cache, m), GDP_STATUS_INVALID_USAGE);
    CHECK_OK(gdp_cache_free_slot_count(cache, &free_after));
    CHECK(free_after == free_before, "a refused apply changed the free slot count %d -> %d", free_before, free_after);
    CHECK_OK(gdp_cache_free(other));
    CHECK_OK(gdp_plan_free(plan));
    printf("slot operations: claim+zero (auto and explicit), release, draft rollback (n_accepted 2 of 3), snapshot "
           "save/restore, refused misuse with nothing modified\n");
}

/* The swap API: a claimed slot's state out to host memory and back into a free slot, bit
 * for bit; bad calls refused with nothing modified. */
static void test_swap(gdp_cache_t cache, const gdp_cache_config *c) {
    gdp_plan_t plan = make_plan(2);
    gdp_prefill_request p1 = {.slot = GDP_SLOT_AUTO, .n_tokens = 4, .flags = GDP_PREFILL_NEW};
    gdp_step_desc d1 = {.prefill_count = 1, .prefill = &p1, .bucket = GDP_BUCKET_AUTO};
    const gdp_step_metadata *m = test_step_local(plan, cache, &d1);
    const int32_t slot = m ? m->step->prefill[0].slot : -1;
    size_t bytes = 0;
    CHECK_OK(gdp_cache_swap_bytes(cache, &bytes));
    CHECK(bytes == (size_t)c->num_layers * (ssm_slot_bytes(c) + conv_slot_bytes(c)), "swap bytes %zu", bytes);
    scribble(cache, c, 21);
    snapshot_copy before = copy_states(cache, c);
    unsigned char *buf = malloc(bytes);
    memset(buf, 0xAB, bytes);
    CHECK_OK(gdp_cache_swap_out(cache, slot, 0, 0, buf));
    /* bad calls: a free slot out, a claimed slot in, a draft step the slot does not have, NULL */
    const int32_t free_slot = lowest_free(cache, c->n_slots);
    CHECK_STATUS(gdp_cache_swap_out(cache, free_slot, 0, 0, buf), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_cache_swap_out(cache, slot, 2, 1, buf), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_cache_swap_out(cache, slot, 0, 0, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_cache_swap_in(cache, slot, buf), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_cache_swap_in(cache, c->n_slots, buf), GDP_STATUS_INVALID_ARGUMENT);
    for (int32_t s = 0; s < c->n_slots; s++)
        CHECK(slot_is(cache, c, s, &before, false), "slot %d changed by a swap-out or a refused call", s);
    int32_t used = 0;
    CHECK_OK(gdp_cache_slot_in_use(cache, free_slot, &used));
    CHECK(used == 0, "a refused swap-in claimed slot %d", free_slot);
    /* back into another (free) slot: the same bytes there, the slot claimed */
    CHECK_OK(gdp_cache_swap_in(cache, free_slot, buf));
    CHECK_OK(gdp_cache_slot_in_use(cache, free_slot, &used));
    CHECK(used == 1, "swap-in did not claim slot %d", free_slot);
    const size_t sb = ssm_slot_bytes(c), cb = conv_slot_bytes(c);
    bool same = true;
    for (int32_t l = 0; l < c->num_layers; l++) {
        gdp_tensor ssm, conv;
        gdp_cache_state_views(cache, l, &ssm, &conv);
        same &= !memcmp((const unsigned char *)ssm.data + free_slot * sb, before.bytes[0][l] + slot * sb, sb);
        same &= !memcmp((const unsigned char *)conv.data + free_slot * cb, before.bytes[1][l] + slot * cb, cb);
    }
    CHECK(same, "slot %d after the swap-in is not slot %d's state before the swap-out", free_slot, slot);
    printf("swap: slot %d out (%zu bytes) and into slot %d bit for bit; 5 bad calls refused, nothing changed\n", slot,
           bytes, free_slot);
    int32_t rel[2] = {slot, free_slot};
    gdp_step_desc d2 = {.release_count = 2, .release_slots = rel, .bucket = GDP_BUCKET_AUTO};
    test_step_local(plan, cache, &d2);
    free(buf);
    free_copy(&before, c->num_layers);
    gdp_plan_free(plan);
}

int main(void) {
    CHECK_OK(gdp_ctx_init(&g_ctx, GDP_BACKEND_CPU, 0));
    test_config();
    gdp_layer_config lc = small_config();
    gdp_tp_shard shard;
    CHECK_OK(gdp_tp_shard_init(&shard, &lc, 0, 1));
    gdp_cache_config c;
    CHECK_OK(gdp_cache_config_init(&c, &shard, N_SLOTS));
    c.max_draft_tokens = MAX_DRAFT;
    c.n_snapshots = N_SNAPSHOTS;
    test_bad_init(&c);
    const gdp_dtype_t ssm_dtypes[2] = {GDP_DTYPE_FP32, GDP_DTYPE_BF16};
    for (int i = 0; i < 2; i++) {
        c.ssm_dtype = ssm_dtypes[i];
        c.conv_dtype = ssm_dtypes[i];
        printf("-- ssm and conv states in %s\n", gdp_dtype_name(c.ssm_dtype));
        gdp_cache_t cache = NULL;
        CHECK_OK(gdp_cache_init(&cache, g_ctx, &c));
        if (cache == NULL)
            break;
        test_views(cache, &c);
        test_slot_operations(cache, &c);
        test_swap(cache, &c);
        CHECK_OK(gdp_cache_free(cache));
    }
    CHECK_OK(gdp_ctx_free(g_ctx));
    return test_finish("test_cache");
}
