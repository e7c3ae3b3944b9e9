/*
 * test_layer_shared.c: gdp_layer_init_shared (include/gdp/layer.h), a second layer over another's
 * weights with its own workspace and ctx, on the CPU backend (one process, no comm):
 *   - a stack of layers from a checkpoint and a stack sharing its weights on a second ctx, each with
 *     its own cache and plan, run the same steps (a prefill of three requests, then decode steps)
 *     on the same inputs: every output bit for bit equal, and equal to a third stack loaded from
 *     the checkpoint on its own (the shared weights are the weights);
 *   - a layer shared from a shared layer uses the first owner's weights (the same outputs);
 *   - freeing a layer whose weights are still shared is refused naming what to do; a layer shared
 *     from a share counts against the owner, not the share (the share frees); after the sharers are
 *     freed the owner frees;
 *   - NULL arguments are refused and *out reset.
 * The CUDA path is the same code with a device ctx (gdp-bench layer --split uses it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gdp/cache.h"
#include "gdp/checkpoint.h"
#include "gdp/layer.h"
#include "gdp/plan.h"
#include "test_common.h"

#define LAYERS 2
#define D_MODEL 32
#define SLOTS 4
#define REQS 3

typedef struct stack {
    gdp_ctx_t ctx;
    gdp_layer_t layers[LAYERS];
    gdp_cache_t cache;
    gdp_plan_t plan;
} stack;

static const gdp_step_bucket k_buckets[] = {{.decode_count = 0, .prefill_count = REQS, .token_count = 64},
                                            {.decode_count = REQS, .prefill_count = 0, .token_count = REQS}};

/* The cache and plan of a stack whose layers exist. */
static void stack_finish(stack *s) {
    gdp_tp_shard shard;
    CHECK_OK(gdp_layer_get_shard(s->layers[0], &shard));
    gdp_cache_config cc;
    CHECK_OK(gdp_cache_config_init(&cc, &shard, SLOTS));
    CHECK_OK(gdp_cache_init(&s->cache, s->ctx, &cc));
    const gdp_plan_config pc = {.num_householder = shard.config.num_householder, .n_slots = SLOTS,
                                .max_decode_tokens = 1, .n_buckets = 2, .buckets = k_buckets};
    CHECK_OK(gdp_plan_init(&s->plan, s->ctx, &pc));
}

static void stack_load(stack *s, gdp_ctx_t ctx, const char *path) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    gdp_checkpoint_t ck = NULL;
    CHECK_OK(gdp_checkpoint_open(&ck, path));
    for (int l = 0; l < LAYERS; l++) {
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w, l, 0, 1));
        CHECK_OK(gdp_layer_init(&s->layers[l], ctx, NULL, &w, GDP_TP_MODE_ALLREDUCE));
        gdp_layer_weights_free(&w);
    }
    gdp_checkpoint_free(ck);
    stack_finish(s);
}

static void stack_share(stack *s, gdp_ctx_t ctx, const stack *src) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    for (int l = 0; l < LAYERS; l++)
        CHECK_OK(gdp_layer_init_shared(&s->layers[l], ctx, src->layers[l]));
    stack_finish(s);
}

/* Frees the layers, then the cache and plan. */
static void stack_free(stack *s) {
    for (int l = 0; l < LAYERS; l++)
        CHECK_OK(gdp_layer_free(s->layers[l]));
    gdp_cache_free(s->cache);
    gdp_plan_free(s->plan);
}

/* One step of desc on the stack, on a copy of x_in: the output rows (malloc'd); *mp its metadata. */
static float *stack_step(stack *s, const gdp_step_desc *d, const float *x_in, int64_t *rows,
                         const gdp_step_metadata **mp) {
    const gdp_step_metadata *m = NULL;
    CHECK_OK(gdp_plan_bcast(s->plan, NULL, 0, d));
    CHECK_OK(gdp_plan_build(s->plan, s->cache, NULL, &m));
    CHECK_OK(gdp_cache_apply_step(s->cache, m));
    *rows = m->padded_token_count;
    float *x = malloc(sizeof(float) * (size_t)(*rows * D_MODEL));
    memcpy(x, x_in, sizeof(float) * (size_t)(*rows * D_MODEL));
    gdp_tensor xt;
    gdp_tensor_init(&xt, x, GDP_DTYPE_FP32, 2, (const int64_t[]){*rows, D_MODEL});
    for (int l = 0; l < LAYERS; l++)
        CHECK_OK(gdp_layer_forward(s->layers[l], s->cache, m, &xt));
    *mp = m;
    return x;
}

/* The same steps on every stack: a prefill of REQS requests (3, 5 and 9 tokens), then 4 decode
 * steps; each step's outputs compared bytewise with stack 0's. */
static void run_same(stack *const *st, int n, const char *what) {
    test_rng r;
    test_rng_seed(&r, 99);
    float x_in[64 * D_MODEL];
    for (int i = 0; i < 64 * D_MODEL; i++)
        x_in[i] = (float)(test_uniform(&r) - 0.5);
    int32_t slots[REQS];
    gdp_prefill_request pre[REQS] = {{.slot = GDP_SLOT_AUTO, .n_tokens = 3, .flags = GDP_PREFILL_NEW},
                                     {.slot = GDP_SLOT_AUTO, .n_tokens = 5, .flags = GDP_PREFILL_NEW},
                                     {.slot = GDP_SLOT_AUTO, .n_tokens = 9, .flags = GDP_PREFILL_NEW}};
    for (int step = 0; step < 5; step++) {
        float *out[4] = {NULL};
        int64_t rows = 0;
        for (int i = 0; i < n; i++) {
            gdp_step_desc d = step == 0 ? (gdp_step_desc){.prefill_count = REQS, .prefill = pre, .decode_tokens = 1,
                                                          .bucket = GDP_BUCKET_AUTO}
                                        : (gdp_step_desc){.decode_count = REQS, .decode_tokens = 1,
                                                          .decode_slots = slots, .bucket = GDP_BUCKET_AUTO};
            const gdp_step_metadata *m = NULL;
            out[i] = stack_step(st[i], &d, x_in + step * D_MODEL, &rows, &m);
            for (int q = 0; step == 0 && q < REQS; q++) { /* the requests' slots, the same in every stack */
                if (i == 0)
                    slots[q] = m->step->prefill[q].slot;
                CHECK(m->step->prefill[q].slot == slots[q], "stack %d put request %d in slot %d, stack 0 in %d", i, q,
                      m->step->prefill[q].slot, slots[q]);
            }
        }
        for (int i = 1; i < n; i++) {
            char label[96];
            snprintf(label, sizeof label, "%s: step %d, stack %d vs stack 0", what, step, i);
            gdp_tensor a, b;
            gdp_tensor_init(&a, out[0], GDP_DTYPE_FP32, 2, (const int64_t[]){rows, D_MODEL});
            gdp_tensor_init(&b, out[i], GDP_DTYPE_FP32, 2, (const int64_t[]){rows, D_MODEL});
            test_same_bytes(label, &b, &a);
        }
        for (int i = 0; i < n; i++)
            free(out[i]);
    }
}

int main(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/gdp_test_layer_shared_%ld.safetensors", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (long)getpid());
    gdp_layer_config cfg;
    gdp_layer_config_default(&cfg);
    cfg.hidden_size = D_MODEL, cfg.num_heads = 8, cfg.num_groups = 4, cfg.head_dim = 16, cfg.state_dim = 16;
    cfg.num_householder = 2, cfg.num_layers = LAYERS;
    CHECK_OK(gdp_checkpoint_write_synthetic(path, &cfg, 1234, GDP_DTYPE_FP32));
    gdp_ctx_t ctx[4] = {NULL};
    for (int i = 0; i < 4; i++)
        CHECK_OK(gdp_ctx_init(&ctx[i], GDP_BACKEND_CPU, 0));
    stack own, shared, shared2, fresh;
    stack_load(&own, ctx[0], path);
    stack_share(&shared, ctx[1], &own);
    stack_share(&shared2, ctx[2], &shared); /* a share of a share: the owner's weights */
    stack_load(&fresh, ctx[3], path);
    stack *const all[4] = {&own, &shared, &shared2, &fresh};
    run_same(all, 4, "shared weights");

    /* the owner's weights are still in use: refused, nothing freed */
    CHECK_STATUS(gdp_layer_free(own.layers[0]), GDP_STATUS_INVALID_USAGE);
    CHECK(strstr(gdp_last_error(), "gdp_layer_init_shared") != NULL && strstr(gdp_last_error(), "free them first"),
          "the refusal does not say what to do: %s", gdp_last_error());
    CHECK_STATUS(gdp_layer_free(shared.layers[1]), GDP_STATUS_SUCCESS); /* no layer shares a shared layer's own */
    CHECK_OK(gdp_layer_init_shared(&shared.layers[1], ctx[1], own.layers[1]));
    /* refusals */
    gdp_layer_t out = (gdp_layer_t)&cfg;
    CHECK_STATUS(gdp_layer_init_shared(&out, ctx[1], NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(out == NULL, "*out not reset by a refused gdp_layer_init_shared");
    CHECK_STATUS(gdp_layer_init_shared(NULL, ctx[1], own.layers[0]), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_layer_init_shared(&out, NULL, own.layers[0]), GDP_STATUS_INVALID_ARGUMENT);

    stack_free(&shared2);
    stack_free(&shared);
    stack_free(&own); /* now nobody shares it */
    stack_free(&fresh);
    for (int i = 0; i < 4; i++)
        gdp_ctx_free(ctx[i]);
    remove(path);
    return test_finish("test_layer_shared");
}
