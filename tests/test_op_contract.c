/*
 * test_op_contract.c: the op API's contract beyond shapes (include/gdp/ops.h, docs/api.md),
 * on the CPU backend (the checks live in the front-ends, so CUDA runs the same code):
 *   - aliasing: an output equal to or overlapping an input, another output or the in-place
 *     cache is refused, naming both, and nothing is written; inputs may share memory; the
 *     norms exactly in place are allowed and give the out-of-place bits;
 *   - the debug-checked mode (gdp_ctx_set_debug_checks, GDP_DEBUG_CHECKS): NaN or positive g,
 *     NaN beta, Inf in q/k/v/x, refused before a cache slot is written; off by default, where
 *     such a call writes NaN into the slot (the hazard the mode is for);
 *   - cache mode with output_final_state: refused by the chunk op and the recurrent op alike.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gdp/ops.h"
#include "internal.h"
#include "test_common.h"

enum { T = 8, H = 1, K = 4, V = 4, SLOTS = 2 };

static test_rng g_rng;

static gdp_tensor filled(gdp_dtype_t dt, int32_t ndim, const int64_t *shape, double lo, double hi) {
    gdp_tensor t = test_tensor_alloc(dt, ndim, shape);
    test_fill_uniform(&t, &g_rng, lo, hi);
    return t;
}

static void *snapshot(const gdp_tensor *t) {
    void *p = malloc(test_tensor_bytes(t));
    memcpy(p, t->data, test_tensor_bytes(t));
    return p;
}

static bool unchanged(const gdp_tensor *t, const void *snap) {
    return memcmp(t->data, snap, test_tensor_bytes(t)) == 0;
}

/* The call must fail with INVALID_ARGUMENT and a message holding both needles. */
#define EXPECT_REFUSED(call, n1, n2, what)                                                                    \
    do {                                                                                                      \
        gdp_status_t st_ = (call);                                                                            \
        CHECK(st_ == GDP_STATUS_INVALID_ARGUMENT && strstr(gdp_last_error(), n1) && strstr(gdp_last_error(), n2), \
              "%s: status %d, message: %s", what, (int)st_, gdp_last_error());                                \
    } while (0)

/* The inputs both ops take (valid values: g < 0, beta in (0, 1)), the cache and the output. */
static void fill_inputs(const int64_t q_shape[4], const int64_t v_shape[4], const int64_t g_shape[3],
                        const int64_t st_shape[4], gdp_tensor *q, gdp_tensor *k, gdp_tensor *v, gdp_tensor *g,
                        gdp_tensor *beta, gdp_tensor *state, gdp_tensor *o) {
    *q = filled(GDP_DTYPE_FP32, 4, q_shape, -1, 1);
    *k = filled(GDP_DTYPE_FP32, 4, q_shape, -1, 1);
    *v = filled(GDP_DTYPE_FP32, 4, v_shape, -1, 1);
    *g = filled(GDP_DTYPE_FP32, 3, g_shape, -0.2, -0.01);
    *beta = filled(GDP_DTYPE_FP32, 3, g_shape, 0.1, 0.9);
    *state = filled(GDP_DTYPE_FP32, 4, st_shape, -1, 1);
    *o = test_tensor_alloc(GDP_DTYPE_FP32, 4, v_shape);
}

/* ---- a chunk call in cache mode: one sequence of T tokens, slot 1 ---- */
typedef struct chunk_case {
    gdp_chunk_args a;
    gdp_tensor     q, k, v, g, beta, cu, ci, cidp, co, state, slots, o;
    int32_t        cu_v[2], slot_v[1];
} chunk_case;

static void chunk_make(chunk_case *c) {
    memset(c, 0, sizeof *c);
    const int64_t q_shape[4] = {1, T, H, K}, v_shape[4] = {1, T, H, V}, g_shape[3] = {1, T, H};
    const int64_t st_shape[4] = {SLOTS, H, K, V}, one[1] = {1}, two[1] = {2};
    fill_inputs(q_shape, v_shape, g_shape, st_shape, &c->q, &c->k, &c->v, &c->g, &c->beta, &c->state, &c->o);
    c->cu = test_tensor_alloc(GDP_DTYPE_INT32, 1, two);
    ((int32_t *)c->cu.data)[1] = T;
    c->slots = test_tensor_alloc(GDP_DTYPE_INT32, 1, one);
    ((int32_t *)c->slots.data)[0] = 1;
    int64_t nc = 0, ncdp = 0;
    CHECK_OK(gdp_max_chunk_counts(T, 1, 1, &nc, &ncdp));
    const int64_t ci_shape[2] = {nc, 2}, cidp_shape[2] = {ncdp, 2};
    c->ci = test_tensor_alloc(GDP_DTYPE_INT32, 2, ci_shape);
    c->cidp = test_tensor_alloc(GDP_DTYPE_INT32, 2, cidp_shape);
    c->co = test_tensor_alloc(GDP_DTYPE_INT32, 1, two);
    CHECK_OK(gdp_build_chunk_descriptors(c->cu.data, 1, 1, T, c->ci.data, c->cidp.data, c->co.data, &nc, &ncdp));
    c->a = (gdp_chunk_args){.q = c->q, .k = c->k, .v = c->v, .g = c->g, .beta = c->beta, .num_householder = 1,
                            .cu_seqlens = c->cu, .chunk_indices = c->ci, .chunk_indices_dp = c->cidp,
                            .chunk_offsets = c->co, .state = c->state, .state_indices = c->slots, .o = c->o};
}

static void chunk_free(chunk_case *c) {
    gdp_tensor *all[] = {&c->q, &c->k, &c->v, &c->g, &c->beta, &c->cu, &c->ci, &c->cidp, &c->co, &c->state,
                         &c->slots, &c->o};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]->data);
}

/* ---- a recurrent (decode) call in cache mode: 2 requests, 1 step, slots 1 and 0 ---- */
typedef struct rec_case {
    gdp_recurrent_args a;
    gdp_tensor         q, k, v, g, beta, state, slots, o, inter;
} rec_case;

static void rec_make(rec_case *c) {
    memset(c, 0, sizeof *c);
    const int64_t q_shape[4] = {2, 1, H, K}, v_shape[4] = {2, 1, H, V}, g_shape[3] = {2, 1, H};
    const int64_t st_shape[4] = {SLOTS, H, K, V}, two[1] = {2}, in_shape[5] = {SLOTS, 1, H, K, V};
    fill_inputs(q_shape, v_shape, g_shape, st_shape, &c->q, &c->k, &c->v, &c->g, &c->beta, &c->state, &c->o);
    c->inter = test_tensor_alloc(GDP_DTYPE_FP32, 5, in_shape);
    c->slots = test_tensor_alloc(GDP_DTYPE_INT32, 1, two);
    ((int32_t *)c->slots.data)[0] = 1, ((int32_t *)c->slots.data)[1] = 0;
    c->a = (gdp_recurrent_args){.q = c->q, .k = c->k, .v = c->v, .g = c->g, .beta = c->beta, .state = c->state,
                                .state_indices = c->slots, .steps_per_token = 1, .o = c->o};
}

static void rec_free(rec_case *c) {
    gdp_tensor *all[] = {&c->q, &c->k, &c->v, &c->g, &c->beta, &c->state, &c->slots, &c->o, &c->inter};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]->data);
}

static void aliasing(gdp_ctx_t ctx) {
    /* chunk: o = q, o = the cache, o overlapping v by a row, chunk_states = o */
    chunk_case c;
    chunk_make(&c);
    CHECK_OK(gdp_chunk_gated_delta_product_varlen(ctx, &c.a));
    void *st_snap = snapshot(&c.state), *q_snap = snapshot(&c.q);
    gdp_chunk_args a = c.a;
    a.o = c.q; /* same shape: K == V */
    EXPECT_REFUSED(gdp_chunk_gated_delta_product_varlen(ctx, &a), "output o", "input q", "chunk o = q");
    CHECK(unchanged(&c.q, q_snap) && unchanged(&c.state, st_snap), "chunk o = q: a refused call wrote");
    EXPECT_REFUSED(gdp_gated_delta_product_recurrent_ref(ctx, &a), "output o", "input q", "recurrent_ref o = q");
    a = c.a;
    a.o.data = c.state.data; /* o's 32 floats inside the cache */
    EXPECT_REFUSED(gdp_chunk_gated_delta_product_varlen(ctx, &a), "output o", "in-place buffer state",
                   "chunk o inside the cache");
    CHECK(unchanged(&c.state, st_snap), "chunk o = cache: a refused call wrote the cache");
    a = c.a;
    a.o.data = (float *)c.v.data + V; /* one token row into v */
    EXPECT_REFUSED(gdp_chunk_gated_delta_product_varlen(ctx, &a), "output o", "input v", "chunk o overlapping v");
    a = c.a;
    a.state = (gdp_tensor){0}, a.state_indices = (gdp_tensor){0};
    a.output_final_state = 1;
    const int64_t fs_shape[4] = {1, H, K, V};
    gdp_tensor init = filled(GDP_DTYPE_FP32, 4, fs_shape, -1, 1);
    a.initial_state = init;
    a.final_state = init; /* the usual in-place wish: refused */
    EXPECT_REFUSED(gdp_chunk_gated_delta_product_varlen(ctx, &a), "output final_state", "input initial_state",
                   "chunk final_state = initial_state");
    gdp_tensor fs = test_tensor_alloc(GDP_DTYPE_FP32, 4, fs_shape);
    a.final_state = fs;
    a.return_chunk_states = 1;
    a.chunk_states = fs; /* two outputs in one buffer */
    EXPECT_REFUSED(gdp_chunk_gated_delta_product_varlen(ctx, &a), "chunk_states", "final_state",
                   "chunk chunk_states = final_state");
    /* Inputs may share memory: q and k from one buffer is fine. */
    a = c.a;
    a.k = c.q;
    CHECK_OK(gdp_chunk_gated_delta_product_varlen(ctx, &a));
    free(init.data), free(fs.data), free(st_snap), free(q_snap);
    chunk_free(&c);

    /* recurrent: o = q, o = the cache, intermediate_states over the cache */
    rec_case r;
    rec_make(&r);
    st_snap = snapshot(&r.state);
    gdp_recurrent_args ra = r.a;
    ra.o = r.q;
    EXPECT_REFUSED(gdp_fused_recurrent_gated_delta_rule_update(ctx, &ra), "output o", "input q", "recurrent o = q");
    ra = r.a;
    ra.o.data = r.state.data;
    EXPECT_REFUSED(gdp_fused_recurrent_gated_delta_rule_update(ctx, &ra), "output o", "in-place buffer state",
                   "recurrent o = state");
    ra = r.a;
    ra.intermediate_states = r.inter;
    ra.intermediate_states.data = r.state.data;
    EXPECT_REFUSED(gdp_fused_recurrent_gated_delta_rule_update(ctx, &ra), "intermediate_states", "state",
                   "recurrent intermediate_states = state");
    CHECK(unchanged(&r.state, st_snap), "recurrent: a refused call wrote the cache");
    ra = r.a;
    ra.k = r.q;
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &ra));
    free(st_snap);
    rec_free(&r);

    /* conv update: y = x, y inside conv_state */
    const int64_t x_shape[3] = {2, 1, 8}, w_shape[2] = {8, 4}, cs_shape[3] = {SLOTS, 8, 4};
    gdp_tensor x = filled(GDP_DTYPE_FP32, 3, x_shape, -1, 1), w = filled(GDP_DTYPE_FP32, 2, w_shape, -1, 1);
    gdp_tensor cs = filled(GDP_DTYPE_FP32, 3, cs_shape, -1, 1), y = test_tensor_alloc(GDP_DTYPE_FP32, 3, x_shape);
    gdp_conv1d_update_args cu = {.x = x, .weight = w, .conv_state = cs, .silu = 1, .y = y};
    CHECK_OK(gdp_causal_conv1d_update(ctx, &cu));
    gdp_conv1d_update_args bad = cu;
    bad.y = x;
    EXPECT_REFUSED(gdp_causal_conv1d_update(ctx, &bad), "output y", "input x", "conv y = x");
    bad = cu;
    bad.y.data = cs.data;
    EXPECT_REFUSED(gdp_causal_conv1d_update(ctx, &bad), "output y", "conv_state", "conv y in conv_state");

    /* norms: out = x (rmsnorm), out = z (gated) */
    const int64_t nx[2] = {2, 8}, nw[1] = {8};
    gdp_tensor nxt = filled(GDP_DTYPE_FP32, 2, nx, -1, 1), nz = filled(GDP_DTYPE_FP32, 2, nx, -1, 1);
    gdp_tensor nwt = filled(GDP_DTYPE_FP32, 1, nw, 0.5, 1.5), nout = test_tensor_alloc(GDP_DTYPE_FP32, 2, nx);
    CHECK_OK(gdp_rmsnorm(ctx, &nout, &nxt, &nwt, 1e-5));
    /* Exactly in place is allowed (each row is read before it is written) and gives the same
     * bits; a partial overlap or out over the weight is refused. */
    gdp_tensor inplace = test_copy_as(&nxt, GDP_DTYPE_FP32);
    CHECK_OK(gdp_rmsnorm(ctx, &inplace, &inplace, &nwt, 1e-5));
    CHECK(memcmp(inplace.data, nout.data, test_tensor_bytes(&nout)) == 0, "rmsnorm in place differs from out of place");
    const int64_t one_row[2] = {1, 8};
    gdp_tensor row0, row1;
    gdp_tensor_init(&row0, nxt.data, GDP_DTYPE_FP32, 2, one_row);
    gdp_tensor_init(&row1, (float *)nxt.data + 4, GDP_DTYPE_FP32, 2, one_row);
    EXPECT_REFUSED(gdp_rmsnorm(ctx, &row1, &row0, &nwt, 1e-5), "output out", "input x", "rmsnorm half a row over");
    gdp_tensor on_w;
    gdp_tensor_init(&on_w, nwt.data, GDP_DTYPE_FP32, 2, one_row);
    EXPECT_REFUSED(gdp_rmsnorm(ctx, &on_w, &row0, &nwt, 1e-5), "output out", "input weight", "rmsnorm out = weight");
    gdp_tensor gsep = test_tensor_alloc(GDP_DTYPE_FP32, 2, nx), zc = test_copy_as(&nz, GDP_DTYPE_FP32);
    CHECK_OK(gdp_gated_rmsnorm(ctx, &gsep, &nxt, &nz, &nwt, 4, 1e-5));
    CHECK_OK(gdp_gated_rmsnorm(ctx, &zc, &nxt, &zc, &nwt, 4, 1e-5)); /* out == z */
    CHECK(memcmp(gsep.data, zc.data, test_tensor_bytes(&gsep)) == 0, "gated rmsnorm out == z differs");
    gdp_tensor nbf = test_copy_as(&nxt, GDP_DTYPE_BF16);
    gdp_tensor nbf_as32 = nbf;
    nbf_as32.dtype = GDP_DTYPE_FP32; /* same start, another dtype: not in place (refused before any write) */
    EXPECT_REFUSED(gdp_rmsnorm(ctx, &nbf_as32, &nbf, &nwt, 1e-5), "output out", "input x", "rmsnorm dtype alias");
    free(inplace.data), free(gsep.data), free(zc.data), free(nbf.data);
    /* l2norm in place: allowed, equal to out of place */
    gdp_tensor sep = test_tensor_alloc(GDP_DTYPE_FP32, 2, nx);
    CHECK_OK(gdp_l2norm(ctx, &sep, &nout));
    CHECK_OK(gdp_l2norm(ctx, &nout, &nout));
    CHECK(memcmp(sep.data, nout.data, test_tensor_bytes(&sep)) == 0, "l2norm in place differs from out of place");
    /* cumsum: g_cumsum = g */
    const int64_t g_shape[3] = {1, T, H}, two[1] = {2};
    gdp_tensor g = filled(GDP_DTYPE_FP32, 3, g_shape, -0.2, -0.01), cuq = test_tensor_alloc(GDP_DTYPE_INT32, 1, two);
    ((int32_t *)cuq.data)[1] = T;
    EXPECT_REFUSED(gdp_chunk_local_cumsum(ctx, &g, NULL, &g, &cuq, 1), "output g_cumsum", "input g", "cumsum in place");
    gdp_tensor *frees[] = {&x, &w, &cs, &y, &nxt, &nz, &nwt, &nout, &sep, &g, &cuq};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++)
        free(frees[i]->data);
}

static void debug_checks(gdp_ctx_t ctx) {
    int32_t on = -1;
    CHECK_OK(gdp_ctx_get_debug_checks(ctx, &on));
    CHECK(on == 0, "debug checks are on by default (%d)", on);
    /* Off: a NaN decay goes straight into the cache slot (the hazard). */
    chunk_case c;
    chunk_make(&c);
    ((float *)c.g.data)[3] = NAN;
    CHECK_OK(gdp_chunk_gated_delta_product_varlen(ctx, &c.a));
    CHECK(isnan(((float *)c.state.data)[K * V]), "without debug checks a NaN g should reach slot 1 (it did not)");
    chunk_free(&c);

    CHECK_OK(gdp_ctx_set_debug_checks(ctx, 1));
    CHECK_OK(gdp_ctx_get_debug_checks(ctx, &on));
    CHECK(on == 1, "gdp_ctx_set_debug_checks(1) did not stick");
    const struct {
        int         which; /* 0 g, 1 beta, 2 k */
        int64_t     flat;
        float       value;
        const char *n1, *n2;
    } cases[] = {
        {0, 3, NAN, "g[0, 3, 0] = nan", "not finite"},
        {0, 5, 0.25f, "g[0, 5, 0] = 0.25", "positive"},
        {1, 2, NAN, "beta[0, 2, 0] = nan", "not finite"},
        {2, 9, INFINITY, "k[0, 2, 0, 1] = inf", "not finite"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int op = 0; op < 2; op++) {
            chunk_case cc;
            rec_case rc;
            chunk_make(&cc);
            rec_make(&rc);
            gdp_tensor *t = op == 0 ? (cases[i].which == 0 ? &cc.g : cases[i].which == 1 ? &cc.beta : &cc.k)
                                    : (cases[i].which == 0 ? &rc.g : cases[i].which == 1 ? &rc.beta : &rc.k);
            const int64_t flat = op == 0 ? cases[i].flat : cases[i].flat % gdp_tensor_numel(t);
            ((float *)t->data)[flat] = cases[i].value;
            gdp_tensor *state = op == 0 ? &cc.state : &rc.state, *o = op == 0 ? &cc.o : &rc.o;
            void *st_snap = snapshot(state), *o_snap = snapshot(o);
            char what[160];
            snprintf(what, sizeof what, "debug %s: %s", op == 0 ? "chunk" : "recurrent", cases[i].n1);
            gdp_status_t st = op == 0 ? gdp_chunk_gated_delta_product_varlen(ctx, &cc.a)
                                      : gdp_fused_recurrent_gated_delta_rule_update(ctx, &rc.a);
            if (op == 0) {
                EXPECT_REFUSED(st, cases[i].n1, cases[i].n2, what);
            } else { /* the decode tensors are [2, 1, H, *]: the index differs, the kind does not */
                EXPECT_REFUSED(st, "debug checks", cases[i].n2, what);
            }
            CHECK(unchanged(state, st_snap) && unchanged(o, o_snap), "%s: a refused call wrote the cache or o", what);
            free(st_snap), free(o_snap);
            chunk_free(&cc);
            rec_free(&rc);
        }
    }
    /* The other ops check their float inputs too. */
    const int64_t x_shape[3] = {2, 1, 8}, w_shape[2] = {8, 4}, cs_shape[3] = {SLOTS, 8, 4};
    gdp_tensor x = filled(GDP_DTYPE_FP32, 3, x_shape, -1, 1), w = filled(GDP_DTYPE_FP32, 2, w_shape, -1, 1);
    gdp_tensor cs = filled(GDP_DTYPE_FP32, 3, cs_shape, -1, 1), y = test_tensor_alloc(GDP_DTYPE_FP32, 3, x_shape);
    ((float *)w.data)[6] = NAN;
    void *cs_snap = snapshot(&cs);
    gdp_conv1d_update_args cu = {.x = x, .weight = w, .conv_state = cs, .silu = 1, .y = y};
    EXPECT_REFUSED(gdp_causal_conv1d_update(ctx, &cu), "weight[1, 2] = nan", "not finite", "debug conv weight");
    CHECK(unchanged(&cs, cs_snap), "debug conv: the conv state was written");
    /* Finite inputs pass with the checks on. */
    ((float *)w.data)[6] = 0.5f;
    CHECK_OK(gdp_causal_conv1d_update(ctx, &cu));
    free(cs_snap);
    gdp_tensor *frees[] = {&x, &w, &cs, &y};
    for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++)
        free(frees[i]->data);
    CHECK_OK(gdp_ctx_set_debug_checks(ctx, 0));

    /* GDP_DEBUG_CHECKS turns the mode on for contexts made afterwards. */
    const char *env[3] = {"1", "0", ""};
    const int32_t want[3] = {1, 0, 0};
    for (int i = 0; i < 3; i++) {
        setenv("GDP_DEBUG_CHECKS", env[i], 1);
        gdp_ctx_t c2 = NULL;
        CHECK_OK(gdp_ctx_init(&c2, GDP_BACKEND_CPU, 0));
        on = -1;
        CHECK_OK(gdp_ctx_get_debug_checks(c2, &on));
        CHECK(on == want[i], "GDP_DEBUG_CHECKS=\"%s\" gave debug checks %d", env[i], on);
        gdp_ctx_free(c2);
    }
    unsetenv("GDP_DEBUG_CHECKS");
    CHECK_STATUS(gdp_ctx_set_debug_checks(NULL, 1), GDP_STATUS_INVALID_ARGUMENT);
}

static void final_state_in_cache_mode(gdp_ctx_t ctx) {
    rec_case r;
    rec_make(&r);
    const int64_t fs_shape[4] = {2, H, K, V};
    gdp_tensor fs = test_tensor_alloc(GDP_DTYPE_FP32, 4, fs_shape);
    void *st_snap = snapshot(&r.state);
    gdp_recurrent_args a = r.a;
    a.output_final_state = 1;
    a.final_state = fs;
    EXPECT_REFUSED(gdp_fused_recurrent_gated_delta_rule_update(ctx, &a), "cache mode", "output_final_state",
                   "recurrent cache mode + output_final_state");
    CHECK(unchanged(&r.state, st_snap), "a refused recurrent call wrote the cache");
    a.output_final_state = 0; /* a final_state given but not asked for is ignored, as in dense mode */
    CHECK_OK(gdp_fused_recurrent_gated_delta_rule_update(ctx, &a));
    free(fs.data), free(st_snap);
    rec_free(&r);
    chunk_case c;
    chunk_make(&c);
    gdp_chunk_args ca = c.a;
    ca.output_final_state = 1;
    EXPECT_REFUSED(gdp_chunk_gated_delta_product_varlen(ctx, &ca), "cache mode", "output_final_state",
                   "chunk cache mode + output_final_state");
    chunk_free(&c);
}

int main(void) {
    test_rng_seed(&g_rng, 1212);
    unsetenv("GDP_DEBUG_CHECKS");
    gdp_ctx_t ctx = NULL;
    CHECK_OK(gdp_ctx_init(&ctx, GDP_BACKEND_CPU, 0));
    aliasing(ctx);
    debug_checks(ctx);
    final_state_in_cache_mode(ctx);
    gdp_ctx_free(ctx);
    return test_finish("test_op_contract");
}
