/*
 * test_checkpoint.c: checkpoints and their tensor-parallel sharding.
 *
 * One process (label cpu): writes seeded synthetic checkpoints (fp32 and bf16), checks
 * they are reproducible and follow Megatron's initial distributions, then loads every
 * rank's shard at tp = 1, 2, 4 and checks that concatenating the per-section slices of
 * the rank shards (in rank order, section by section, with section sizes computed here
 * from gdp-layer.md's formulas, not from the library) reproduces every global tensor
 * bit for bit; out_proj by input columns. Then bad checkpoints: a missing tensor, a
 * wrong shape, a wrong dtype, a truncated file, missing metadata, H or G not divisible
 * by tp, out-of-range layer or rank: each gives INVALID_ARGUMENT naming the tensor or
 * the numbers, leaves the output struct untouched and the heap as it was. Poisoned weights:
 * a NaN or Inf in each kind of tensor (norms, every in_proj and conv section, A_log, dt_bias,
 * out_proj, embedding, final norm) is refused naming the tensor, the index and the value, and
 * loads with the finite check off; a non-finite eps or an out-of-range vocab_size fails open.
 *
 * With --mpi (label mpi, under mpirun): rank 0 writes the files, every rank loads its own
 * shard at tp = world size, the slices are all-gathered through the MPI comm and compared
 * with the global tensors on every rank, and every rank must get the same error from each
 * bad file. Wrong counts are summed over ranks so all ranks exit the same way.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gdp/checkpoint.h"
#include "gdp/comm.h"
#include "internal.h" /* defines: gdp_store_elem, gdp_load_elem */
#include "test_common.h"

static int g_mpi, g_rank, g_size = 1;
static gdp_comm_t g_comm;
static char g_dir[256];

/* ---- helpers ---------------------------------------------------------------------- */
static void path_of(char *buf, size_t n, const char *file) { snprintf(buf, n, "%s/%s", g_dir, file); }

/* Bytes malloc holds for the program. glibc counts chunks freed into its per-thread cache
 * (tcache) and fast bins as in use, so main turns both off (a failed load that allocated and
 * freed would otherwise look like a leak). */
static size_t heap_in_use(void) { return mallinfo2().uordblks; }

/* The single-process run re-executes itself once with glibc's tcache off (a tunable read at
 * start-up only); fast bins are turned off with mallopt. */
static void exact_heap_accounting(char **argv) {
    const char *tun = getenv("GLIBC_TUNABLES");
    if (tun == NULL || strstr(tun, "glibc.malloc.tcache_count=0") == NULL) {
        char value[512];
        snprintf(value, sizeof value, "%s%sglibc.malloc.tcache_count=0", tun ? tun : "", tun ? ":" : "");
        setenv("GLIBC_TUNABLES", value, 1);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "warning: could not re-execute with the tcache off; the heap checks may fail spuriously\n");
    }
    mallopt(M_MXFAST, 0);
}

/* The global tensor `name` (malloc'd bytes) and its size. */
static void *read_global(gdp_st_file *f, const char *name, size_t *bytes) {
    const gdp_st_info *info = gdp_st_find(f, name);
    if (info == NULL)
        return NULL;
    void *data = NULL;
    if (gdp_st_load(f, name, &data, NULL) != GDP_STATUS_SUCCESS)
        return NULL;
    *bytes = info->nbytes;
    return data;
}

/* Section sizes of gdp-layer.md 1.1 on a rank (rows, all TP-local):
 * z d_t | V_m d_t | K_m G_t*N | Q G_t*N | b_m H_t | a H_t. Conv: the V, K, Q part. */
typedef struct expected_section {
    char    suffix[16];
    int64_t rows_local;
} expected_section;

static int expected_sections(const gdp_layer_config *c, int tp, int conv, expected_section *out) {
    int n = 0;
    const int64_t Ht = c->num_heads / tp, Gt = c->num_groups / tp, dt = Ht * c->head_dim, gn = Gt * c->state_dim;
    if (!conv) {
        snprintf(out[n].suffix, sizeof out[n].suffix, "z");
        out[n++].rows_local = dt;
    }
    for (int m = 0; m < c->num_householder; m++) {
        snprintf(out[n].suffix, sizeof out[n].suffix, "V%d", m);
        out[n++].rows_local = dt;
    }
    for (int m = 0; m < c->num_householder; m++) {
        snprintf(out[n].suffix, sizeof out[n].suffix, "K%d", m);
        out[n++].rows_local = gn;
    }
    snprintf(out[n].suffix, sizeof out[n].suffix, "Q");
    out[n++].rows_local = gn;
    if (!conv) {
        for (int m = 0; m < c->num_householder; m++) {
            snprintf(out[n].suffix, sizeof out[n].suffix, "b%d", m);
            out[n++].rows_local = Ht;
        }
        snprintf(out[n].suffix, sizeof out[n].suffix, "a");
        out[n++].rows_local = Ht;
    }
    return n;
}

/* Gathers `bytes_per_rank` bytes from each rank's `mine` (or, in one process, from the
 * shards[r] pointers) into `all`, in rank order. */
static void gather_slices(char *all, const char *const *per_rank, size_t bytes_per_rank, int tp) {
    if (g_mpi) {
        /* moved as 2-byte units: every slice is a whole number of bf16 or fp32 elements */
        CHECK_OK(gdp_comm_allgather(g_comm, per_rank[0], all, bytes_per_rank / 2, GDP_DTYPE_BF16, NULL));
        return;
    }
    for (int r = 0; r < tp; r++)
        memcpy(all + (size_t)r * bytes_per_rank, per_rank[r], bytes_per_rank);
}

/* Loads the shards of one layer at `tp` (all ranks here, or this rank's under MPI),
 * reassembles every global tensor from the slices and compares bytes. Returns the
 * number of tensors that differ. */
static int64_t check_layer_reassembly(gdp_checkpoint_t ck, gdp_st_file *f, const gdp_layer_config *c, int layer,
                                      int tp, gdp_dtype_t wt) {
    const size_t es = gdp_dtype_size(wt);
    const int n_local = g_mpi ? 1 : tp;
    gdp_layer_weights w[8];
    memset(w, 0, sizeof w);
    for (int i = 0; i < n_local; i++) {
        int r = g_mpi ? g_rank : i;
        CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w[i], layer, r, tp));
    }
    int64_t wrong = 0;
    const int64_t D = c->hidden_size, Ht = c->num_heads / tp, dt = Ht * c->head_dim;
    char name[160];
    const char *per_rank[8];

    /* local shapes */
    for (int i = 0; i < n_local; i++) {
        int64_t in_rows = 0, conv_rows = 0;
        expected_section sec[64];
        int ns = expected_sections(c, tp, 0, sec);
        for (int s = 0; s < ns; s++)
            in_rows += sec[s].rows_local;
        ns = expected_sections(c, tp, 1, sec);
        for (int s = 0; s < ns; s++)
            conv_rows += sec[s].rows_local;
        bool ok = w[i].in_proj.ndim == 2 && w[i].in_proj.shape[0] == in_rows && w[i].in_proj.shape[1] == D &&
                  w[i].conv.shape[0] == conv_rows && w[i].conv.shape[1] == c->conv_width &&
                  w[i].A_log.shape[0] == Ht && w[i].A_log.dtype == GDP_DTYPE_FP32 && w[i].dt_bias.shape[0] == Ht &&
                  w[i].out_norm_weight.shape[0] == dt && w[i].out_proj.shape[0] == D &&
                  w[i].out_proj.shape[1] == dt && w[i].dtype == wt && w[i].in_proj.dtype == wt;
        CHECK(ok, "layer %d tp %d: shard shapes wrong (in_proj [%lld, %lld] vs %lld rows, conv [%lld, %lld] vs %lld)",
              layer, tp, (long long)w[i].in_proj.shape[0], (long long)w[i].in_proj.shape[1], (long long)in_rows,
              (long long)w[i].conv.shape[0], (long long)w[i].conv.shape[1], (long long)conv_rows);
        if (!ok) {
            for (int j = 0; j < n_local; j++)
                gdp_layer_weights_free(&w[j]);
            return 1;
        }
    }

    /* in_proj and conv: per section, the rank slices in rank order are the global section */
    for (int conv = 0; conv < 2; conv++) {
        expected_section sec[64];
        int ns = expected_sections(c, tp, conv, sec);
        int64_t cols = conv ? c->conv_width : D, offset = 0;
        for (int s = 0; s < ns; s++) {
            snprintf(name, sizeof name, "layers.%d.%s.%.15s", layer, conv ? "conv" : "in_proj", sec[s].suffix);
            size_t gbytes = 0;
            char *global = read_global(f, name, &gbytes);
            size_t slice = (size_t)(sec[s].rows_local * cols) * es;
            char *all = calloc((size_t)tp * slice + 1, 1);
            for (int i = 0; i < n_local; i++)
                per_rank[i] = (const char *)(conv ? w[i].conv.data : w[i].in_proj.data) + (size_t)(offset * cols) * es;
            gather_slices(all, per_rank, slice, tp);
            bool same = global != NULL && gbytes == (size_t)tp * slice && memcmp(all, global, gbytes) == 0;
            CHECK(same, "layer %d tp %d: %s reassembled from the rank slices differs from the global tensor", layer,
                  tp, name);
            wrong += !same;
            offset += sec[s].rows_local;
            free(all);
            free(global);
        }
    }

    /* A_log, dt_bias, out_norm.weight: by heads; norm.weight: whole on every rank */
    struct {
        const char *suffix;
        size_t      bytes;
        int         which;
    } vecs[] = {{"A_log", (size_t)Ht * 4, 0}, {"dt_bias", (size_t)Ht * es, 1}, {"out_norm.weight", (size_t)dt * es, 2}};
    for (int v = 0; v < 3; v++) {
        snprintf(name, sizeof name, "layers.%d.%s", layer, vecs[v].suffix);
        size_t gbytes = 0;
        char *global = read_global(f, name, &gbytes);
        char *all = calloc((size_t)tp * vecs[v].bytes + 1, 1);
        for (int i = 0; i < n_local; i++)
            per_rank[i] = vecs[v].which == 0 ? w[i].A_log.data : vecs[v].which == 1 ? w[i].dt_bias.data
                                                                                   : w[i].out_norm_weight.data;
        gather_slices(all, per_rank, vecs[v].bytes, tp);
        bool same = global != NULL && gbytes == (size_t)tp * vecs[v].bytes && memcmp(all, global, gbytes) == 0;
        CHECK(same, "layer %d tp %d: %s reassembled by heads differs from the global tensor", layer, tp, name);
        wrong += !same;
        free(all);
        free(global);
    }
    snprintf(name, sizeof name, "layers.%d.norm.weight", layer);
    size_t gbytes = 0;
    char *global = read_global(f, name, &gbytes);
    for (int i = 0; i < n_local; i++) {
        bool same = global != NULL && gbytes == (size_t)D * es && memcmp(w[i].norm_weight.data, global, gbytes) == 0;
        CHECK(same, "layer %d tp %d: %s on a rank differs from the global tensor", layer, tp, name);
        wrong += !same;
    }
    free(global);

    /* out_proj: rank r holds columns [r*d_t, (r+1)*d_t) of every row */
    snprintf(name, sizeof name, "layers.%d.out_proj", layer);
    global = read_global(f, name, &gbytes);
    size_t slice = (size_t)(D * dt) * es;
    char *all = calloc((size_t)tp * slice + 1, 1), *rebuilt = calloc((size_t)tp * slice + 1, 1);
    for (int i = 0; i < n_local; i++)
        per_rank[i] = w[i].out_proj.data;
    gather_slices(all, per_rank, slice, tp);
    for (int r = 0; r < tp; r++)
        for (int64_t d = 0; d < D; d++)
            memcpy(rebuilt + (size_t)(d * dt * tp + r * dt) * es, all + (size_t)r * slice + (size_t)(d * dt) * es,
                   (size_t)dt * es);
    bool same = global != NULL && gbytes == (size_t)tp * slice && memcmp(rebuilt, global, gbytes) == 0;
    CHECK(same, "layer %d tp %d: %s reassembled by columns differs from the global tensor", layer, tp, name);
    wrong += !same;
    free(all);
    free(rebuilt);
    free(global);
    for (int i = 0; i < n_local; i++)
        gdp_layer_weights_free(&w[i]);
    return wrong;
}

/* ---- synthetic checkpoints: reproducible, Megatron's distributions ----------------- */
static bool files_equal(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool eq = fa && fb;
    while (eq) {
        int ca = fgetc(fa), cb = fgetc(fb);
        eq = ca == cb;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return eq;
}

static void test_distributions(gdp_st_file *f, const gdp_layer_config *c, gdp_dtype_t wt) {
    int64_t n;
    /* bf16 keeps 8 significant bits: bounds below allow one rounding (2^-8 relative) */
    const double rel = wt == GDP_DTYPE_BF16 ? 1.0 / 256 : 1e-6;
    double *a_log = test_st_f64(f, "layers.0.A_log", &n);
    bool ok = a_log != NULL && n == c->num_heads;
    for (int64_t i = 0; ok && i < n; i++)
        ok = isfinite(a_log[i]) && exp(a_log[i]) > 0 && exp(a_log[i]) < 16.0 * (1 + 1e-6);
    CHECK(ok, "A_log = log U(0, 16): a value is outside (-inf, log 16)");
    free(a_log);
    double *dt_bias = test_st_f64(f, "layers.1.dt_bias", &n);
    ok = dt_bias != NULL && n == c->num_heads;
    for (int64_t i = 0; ok && i < n; i++) {
        double dt = log1p(exp(dt_bias[i])); /* softplus */
        ok = dt >= 1e-3 * (1 - 2 * rel) && dt <= 0.1 * (1 + 2 * rel);
    }
    CHECK(ok, "dt_bias = softplus^-1(dt), dt in [1e-3, 0.1]: softplus(dt_bias) is outside");
    free(dt_bias);
    double *conv = test_st_f64(f, "layers.0.conv.K1", &n);
    ok = conv != NULL && n == c->num_groups * c->state_dim * c->conv_width;
    double bound = 1.0 / sqrt((double)c->conv_width) * (1 + rel);
    for (int64_t i = 0; ok && i < n; i++)
        ok = fabs(conv[i]) <= bound;
    CHECK(ok, "conv ~ U(-1/sqrt(W), 1/sqrt(W)): a value is outside the bound");
    free(conv);
    const char *ones[] = {"layers.0.norm.weight", "layers.1.out_norm.weight"};
    for (int k = 0; k < 2; k++) {
        double *w = test_st_f64(f, ones[k], &n);
        ok = w != NULL && n > 0;
        for (int64_t i = 0; ok && i < n; i++)
            ok = w[i] == 1.0;
        CHECK(ok, "%s is not all ones", ones[k]);
        free(w);
    }
    /* sample standard deviations of the projections (thousands of samples: within 10%) */
    struct {
        const char *name;
        double      std;
    } proj[] = {{"layers.0.in_proj.z", 0.02}, {"layers.1.out_proj", 0.02 / sqrt(2.0 * c->num_layers)}};
    for (int k = 0; k < 2; k++) {
        double *w = test_st_f64(f, proj[k].name, &n);
        double s = 0, s2 = 0;
        for (int64_t i = 0; w && i < n; i++) {
            s += w[i];
            s2 += w[i] * w[i];
        }
        double mean = n ? s / (double)n : 0, sd = n ? sqrt(s2 / (double)n - mean * mean) : 0;
        CHECK(w != NULL && fabs(sd / proj[k].std - 1) < 0.1 && fabs(mean) < 0.2 * proj[k].std,
              "%s: sample mean %g, std %g; expected N(0, %g)", proj[k].name, mean, sd, proj[k].std);
        free(w);
    }
}

/* ---- bad checkpoints ---------------------------------------------------------------- */
typedef enum mutation { MUT_DROP, MUT_SHAPE, MUT_DTYPE, MUT_NO_META } mutation;

/* The end of a rewrite of f: its n entries e (data in bufs) and nk metadata pairs written to
 * dst; then the buffers freed and f closed. */
static void write_rewritten(gdp_st_file *f, const char *dst, gdp_st_entry *e, void **bufs, int32_t n,
                            const char **ks, const char **vs, int32_t nk) {
    CHECK_OK(gdp_st_write(dst, e, n, ks, vs, nk));
    for (int32_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(e);
    gdp_st_close(f);
}

/* Rewrites `src` into `dst` with one change to tensor `target` (or the metadata). */
static void write_mutated(const char *src, const char *dst, mutation mut, const char *target) {
    gdp_st_file *f = NULL;
    CHECK_OK(gdp_st_open(src, &f));
    if (f == NULL)
        return;
    int32_t n = gdp_st_count(f), k = 0;
    gdp_st_entry *e = calloc((size_t)n, sizeof *e);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    for (int32_t i = 0; i < n; i++) {
        const gdp_st_info *info = gdp_st_at(f, i);
        if (mut == MUT_DROP && strcmp(info->name, target) == 0)
            continue;
        CHECK_OK(gdp_st_load(f, info->name, &bufs[k], NULL));
        e[k].name = info->name;
        e[k].dtype = info->dtype;
        e[k].ndim = info->ndim;
        memcpy(e[k].shape, info->shape, sizeof e[k].shape);
        e[k].data = bufs[k];
        if (strcmp(info->name, target) == 0 && mut == MUT_SHAPE) {
            e[k].shape[e[k].ndim - 1] -= 1; /* same data, one column fewer: a config mismatch */
        } else if (strcmp(info->name, target) == 0 && mut == MUT_DTYPE) {
            /* the other float dtype: fp32 <-> bf16, converted values */
            gdp_dtype_t to = info->dtype == GDP_DTYPE_FP32 ? GDP_DTYPE_BF16 : GDP_DTYPE_FP32;
            void *conv = calloc((size_t)info->numel, gdp_dtype_size(to));
            for (int64_t j = 0; j < info->numel; j++)
                gdp_store_elem(conv, to, j, gdp_load_elem(bufs[k], info->dtype, j));
            free(bufs[k]);
            bufs[k] = conv;
            e[k].data = conv;
            e[k].dtype = to;
        }
        k++;
    }
    const char *keys[] = {"format", "hidden_size", "num_heads", "num_groups", "head_dim", "state_dim",
                          "num_householder", "conv_width", "num_layers", "dtype", "norm_eps", "out_norm_eps"};
    const char *vals[12];
    int32_t nk = 0;
    const char *ks[12];
    for (int i = 0; i < 12; i++) {
        if (mut == MUT_NO_META && strcmp(keys[i], target) == 0)
            continue;
        ks[nk] = keys[i];
        vals[nk++] = gdp_st_metadata(f, keys[i]);
    }
    write_rewritten(f, dst, e, bufs, k, ks, vals, nk);
}

/* Every rank must see `want` with a message containing both needles; counted over ranks. */
static void expect_everywhere(gdp_status_t got, gdp_status_t want, const char *n1, const char *n2, const char *what) {
    int ok = got == want && strstr(gdp_last_error(), n1) != NULL && (n2 == NULL || strstr(gdp_last_error(), n2));
    CHECK(ok, "%s: got %d (%s), expected %d naming '%s'%s%s", what, (int)got, gdp_last_error(), (int)want, n1,
          n2 ? " and " : "", n2 ? n2 : "");
    if (g_mpi) {
        int all = 0;
        MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(all == g_size, "%s: only %d of %d ranks got the expected error", what, all, g_size);
    }
}

/* A failing load must leave *out and the heap as they were. */
static void expect_load_error(gdp_checkpoint_t ck, int layer, int rank, int tp, const char *n1, const char *n2,
                              const char *what) {
    gdp_layer_weights w;
    memset(&w, 0xa5, sizeof w);
    gdp_layer_weights before = w;
    size_t heap = heap_in_use();
    gdp_status_t st = gdp_checkpoint_load_layer_shard(ck, &w, layer, rank, tp);
    size_t heap_after = heap_in_use();
    expect_everywhere(st, GDP_STATUS_INVALID_ARGUMENT, n1, n2, what);
    CHECK(memcmp(&w, &before, sizeof w) == 0, "%s: the failing load modified *out", what);
    /* Under mpirun, MPI's own threads may allocate meanwhile: the heap check is single-process. */
    if (!g_mpi)
        CHECK(heap_after == heap, "%s: the failing load changed the heap in use from %zu to %zu bytes", what, heap,
              heap_after);
}

static void test_bad_checkpoints(const char *good) {
    char bad[512];
    gdp_checkpoint_t ck = NULL;
    struct {
        mutation    mut;
        const char *target;
        const char *file;
        const char *n2;
        int         layer;
    } cases[] = {
        {MUT_DROP, "layers.1.in_proj.K1", "missing.safetensors", "has no tensor", 1},
        {MUT_SHAPE, "layers.0.conv.Q", "shape.safetensors", "has shape [16, 3], expected [16, 4]", 0},
        {MUT_DTYPE, "layers.0.A_log", "dtype_alog.safetensors", "has dtype BF16, expected F32", 0},
        {MUT_DTYPE, "layers.1.out_proj", "dtype_out.safetensors", "has dtype F32, expected BF16", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        path_of(bad, sizeof bad, cases[i].file);
        if (g_rank == 0)
            write_mutated(good, bad, cases[i].mut, cases[i].target);
        if (g_mpi)
            MPI_Barrier(MPI_COMM_WORLD);
        CHECK_OK(gdp_checkpoint_open(&ck, bad));
        if (ck == NULL)
            continue;
        int tp = g_mpi ? g_size : 2, rank = g_mpi ? g_rank : 1;
        expect_load_error(ck, cases[i].layer, rank, tp, cases[i].target, cases[i].n2, cases[i].file);
        /* the other layer is intact and still loads */
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w, 1 - cases[i].layer, rank, tp));
        gdp_layer_weights_free(&w);
        /* the whole-file check finds the same problem without reading data */
        expect_everywhere(gdp_checkpoint_check(ck, tp), GDP_STATUS_INVALID_ARGUMENT, cases[i].target, cases[i].n2,
                          cases[i].file);
        CHECK_OK(gdp_checkpoint_free(ck));
        ck = NULL;
    }

    /* missing metadata: open names the key */
    path_of(bad, sizeof bad, "nometa.safetensors");
    if (g_rank == 0)
        write_mutated(good, bad, MUT_NO_META, "num_groups");
    if (g_mpi)
        MPI_Barrier(MPI_COMM_WORLD);
    expect_everywhere(gdp_checkpoint_open(&ck, bad), GDP_STATUS_INVALID_ARGUMENT, "num_groups", "no metadata key",
                      "missing metadata");
    CHECK(ck == NULL, "a failed open left a handle");

    /* truncated file: open names the tensor whose data runs past the end (the last one) */
    path_of(bad, sizeof bad, "truncated.safetensors");
    if (g_rank == 0) {
        FILE *in = fopen(good, "rb"), *out = fopen(bad, "wb");
        fseek(in, 0, SEEK_END);
        long size = ftell(in);
        fseek(in, 0, SEEK_SET);
        for (long i = 0; i < size - 100; i++)
            fputc(fgetc(in), out);
        fclose(in);
        fclose(out);
    }
    if (g_mpi)
        MPI_Barrier(MPI_COMM_WORLD);
    expect_everywhere(gdp_checkpoint_open(&ck, bad), GDP_STATUS_INVALID_ARGUMENT, "layers.1.out_proj", "truncated",
                      "truncated file");
    CHECK(ck == NULL, "a failed open left a handle");
}

/* ---- poisoned weights and hostile metadata -------------------------------------------- */
static const char *const k_meta_keys[] = {"format",     "format_version", "hidden_size", "num_heads",
                                          "num_groups", "head_dim",       "state_dim",   "num_householder",
                                          "conv_width", "num_layers",     "vocab_size",  "dtype",
                                          "norm_eps",   "out_norm_eps"};
#define N_META_KEYS ((int)(sizeof k_meta_keys / sizeof k_meta_keys[0]))

/* Copies `src` to `dst` with element `flat` of tensor `target` (NULL: none) set to `value`,
 * and metadata `key` (NULL: none) set to `meta_value`. */
static void write_copy(const char *src, const char *dst, const char *target, int64_t flat, double value,
                       const char *key, const char *meta_value) {
    gdp_st_file *f = NULL;
    CHECK_OK(gdp_st_open(src, &f));
    if (f == NULL)
        return;
    const int32_t n = gdp_st_count(f);
    gdp_st_entry *e = calloc((size_t)n, sizeof *e);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    bool found = target == NULL;
    for (int32_t i = 0; i < n; i++) {
        const gdp_st_info *info = gdp_st_at(f, i);
        CHECK_OK(gdp_st_load(f, info->name, &bufs[i], NULL));
        e[i] = (gdp_st_entry){.name = info->name, .dtype = info->dtype, .ndim = info->ndim, .data = bufs[i]};
        memcpy(e[i].shape, info->shape, sizeof e[i].shape);
        if (target != NULL && strcmp(info->name, target) == 0) {
            gdp_store_elem(bufs[i], info->dtype, flat, value);
            found = true;
        }
    }
    CHECK(found, "write_copy: %s has no tensor %s", src, target);
    const char *ks[N_META_KEYS], *vs[N_META_KEYS];
    int32_t nk = 0;
    for (int i = 0; i < N_META_KEYS; i++) {
        const char *v = key != NULL && strcmp(k_meta_keys[i], key) == 0 ? meta_value : gdp_st_metadata(f, k_meta_keys[i]);
        if (v != NULL)
            ks[nk] = k_meta_keys[i], vs[nk++] = v;
    }
    write_rewritten(f, dst, e, bufs, n, ks, vs, nk);
}

/* Opens `path` written by rank 0 (every rank, after a barrier). */
static gdp_checkpoint_t open_shared(const char *path) {
    if (g_mpi)
        MPI_Barrier(MPI_COMM_WORLD);
    gdp_checkpoint_t ck = NULL;
    CHECK_OK(gdp_checkpoint_open(&ck, path));
    return ck;
}

/* A NaN or Inf in any weight: the load is refused naming the tensor, the first bad element's
 * index in the checkpoint tensor and its value; with the check off the same file loads. */
static void test_poisoned_weights(const gdp_layer_config *base, gdp_dtype_t wt) {
    gdp_layer_config c = *base;
    c.vocab_size = 40;
    char good[512], bad[512];
    path_of(good, sizeof good, "vocab.safetensors");
    if (g_rank == 0)
        CHECK_OK(gdp_checkpoint_write_synthetic(good, &c, 99, wt));
    const int64_t D = c.hidden_size; /* 24 */
    /* (tensor, flat index, value, expected index text): each kind a layer or the model reads */
    const struct {
        const char *name;
        int64_t     flat;
        double      value;
        const char *where;
        int         layer; /* -1: a model tensor */
    } cases[] = {
        {"layers.0.norm.weight", 5, NAN, "[5]", 0},
        {"layers.1.in_proj.z", 2 * D + 7, INFINITY, "[2, 7]", 1},
        {"layers.0.in_proj.V1", 3 * D, NAN, "[3, 0]", 0},
        {"layers.0.in_proj.K0", 15 * D + 23, -INFINITY, "[15, 23]", 0},
        {"layers.1.in_proj.Q", 1, NAN, "[0, 1]", 1},
        {"layers.0.in_proj.b1", 7 * D + 2, NAN, "[7, 2]", 0},
        {"layers.0.in_proj.a", 0, INFINITY, "[0, 0]", 0},
        {"layers.0.conv.V0", 4 * 4 + 3, NAN, "[4, 3]", 0},
        {"layers.1.conv.K1", 2, NAN, "[0, 2]", 1},
        {"layers.0.conv.Q", 9 * 4 + 1, -INFINITY, "[9, 1]", 0},
        {"layers.0.A_log", 6, NAN, "[6]", 0},
        {"layers.1.A_log", 0, INFINITY, "[0]", 1},
        {"layers.0.dt_bias", 3, NAN, "[3]", 0},
        {"layers.0.out_norm.weight", 20, INFINITY, "[20]", 0},
        {"layers.1.out_proj", 5 * 24 + 11, NAN, "[5, 11]", 1},
        {"embedding", 33 * D + 4, NAN, "[33, 4]", -1},
        {"final_norm.weight", 23, -INFINITY, "[23]", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        path_of(bad, sizeof bad, "poisoned.safetensors");
        if (g_rank == 0)
            write_copy(good, bad, cases[i].name, cases[i].flat, cases[i].value, NULL, NULL);
        gdp_checkpoint_t ck = open_shared(bad);
        if (ck == NULL)
            continue;
        char what[160];
        snprintf(what, sizeof what, "%s poisoned at %s", cases[i].name, cases[i].where);
        const char *value = isnan(cases[i].value) ? "nan" : cases[i].value > 0 ? "inf" : "-inf";
        if (cases[i].layer >= 0) {
            expect_load_error(ck, cases[i].layer, 0, 1, cases[i].name, cases[i].where, what);
            CHECK(strstr(gdp_last_error(), value) != NULL && strstr(gdp_last_error(), "--no-finite-check") != NULL,
                  "%s: the message lacks the value %s or the way out: %s", what, value, gdp_last_error());
            gdp_layer_weights w;
            memset(&w, 0, sizeof w);
            /* the other layer is clean */
            CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w, 1 - cases[i].layer, 0, 1));
            gdp_layer_weights_free(&w);
            CHECK_OK(gdp_checkpoint_set_finite_check(ck, 0));
            CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w, cases[i].layer, 0, 1));
            gdp_layer_weights_free(&w);
        } else {
            gdp_model_weights mw;
            memset(&mw, 0x5a, sizeof mw);
            gdp_model_weights before = mw;
            gdp_status_t st = gdp_checkpoint_load_model_weights(ck, &mw);
            expect_everywhere(st, GDP_STATUS_INVALID_ARGUMENT, cases[i].name, cases[i].where, what);
            CHECK(strstr(gdp_last_error(), value) != NULL, "%s: the message lacks %s: %s", what, value,
                  gdp_last_error());
            CHECK(memcmp(&mw, &before, sizeof mw) == 0, "%s: the failing load modified *out", what);
            CHECK_OK(gdp_checkpoint_set_finite_check(ck, 0));
            CHECK_OK(gdp_checkpoint_load_model_weights(ck, &mw));
            gdp_model_weights_free(&mw);
        }
        CHECK_OK(gdp_checkpoint_free(ck));
        if (g_mpi)
            MPI_Barrier(MPI_COMM_WORLD); /* the next case rewrites the file */
    }
    CHECK_STATUS(gdp_checkpoint_set_finite_check(NULL, 1), GDP_STATUS_INVALID_ARGUMENT);

    /* A shard reads only its rows / columns: at tp = 2 the poisoned element of out_proj's
     * column 20 (rank 1's input columns 12..23) and of K0's row 12 (group 3, rank 1's) fail
     * rank 1 with the index in the checkpoint tensor; rank 0's shard is clean and loads. */
    const struct {
        const char *name;
        int64_t     flat;
        const char *where;
    } sharded[] = {{"layers.0.out_proj", 7 * 24 + 20, "[7, 20]"}, {"layers.0.in_proj.K0", 12 * D + 1, "[12, 1]"}};
    for (size_t i = 0; i < sizeof sharded / sizeof sharded[0]; i++) {
        if (g_rank == 0)
            write_copy(good, bad, sharded[i].name, sharded[i].flat, NAN, NULL, NULL);
        gdp_checkpoint_t ck = open_shared(bad);
        if (ck == NULL)
            continue;
        expect_load_error(ck, 0, 1, 2, sharded[i].name, sharded[i].where, "a poisoned shard");
        gdp_layer_weights w;
        memset(&w, 0, sizeof w);
        CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w, 0, 0, 2));
        gdp_layer_weights_free(&w);
        CHECK_OK(gdp_checkpoint_free(ck));
        if (g_mpi)
            MPI_Barrier(MPI_COMM_WORLD);
    }

    /* Metadata: a non-finite eps and a vocabulary beyond int32 token ids are refused at open. */
    const struct {
        const char *key, *value, *n2;
    } meta[] = {{"norm_eps", "inf", "not a finite number"},
                {"out_norm_eps", "nan", "not a finite number"},
                {"vocab_size", "576460752303423488", "out of range"},
                {"vocab_size", "2147483648", "out of range"}};
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++) {
        path_of(bad, sizeof bad, "badmeta.safetensors");
        if (g_rank == 0)
            write_copy(good, bad, NULL, 0, 0, meta[i].key, meta[i].value);
        if (g_mpi)
            MPI_Barrier(MPI_COMM_WORLD);
        gdp_checkpoint_t ck = NULL;
        char what[160];
        snprintf(what, sizeof what, "metadata %s = %s", meta[i].key, meta[i].value);
        expect_everywhere(gdp_checkpoint_open(&ck, bad), GDP_STATUS_INVALID_ARGUMENT, meta[i].key, meta[i].n2, what);
        CHECK(ck == NULL, "%s: a failed open left a handle", what);
        if (g_mpi)
            MPI_Barrier(MPI_COMM_WORLD);
    }
}

static void test_divisibility(const char *good, const gdp_layer_config *c, gdp_dtype_t wt) {
    gdp_checkpoint_t ck = NULL;
    CHECK_OK(gdp_checkpoint_open(&ck, good));
    if (ck == NULL)
        return;
    /* H = 8 and G = 4 are not divisible by 3 */
    expect_load_error(ck, 0, 0, 3, "num_heads H = 8", "tp_size = 3", "H and G not divisible by tp");
    expect_load_error(ck, 2, 0, 1, "layer 2 is outside", NULL, "layer out of range");
    expect_load_error(ck, 0, 4, 4, "tp_rank = 4", NULL, "tp_rank out of range");
    CHECK_OK(gdp_checkpoint_free(ck));
    /* H divisible by 4 but G = 2 is not */
    gdp_layer_config c2 = *c;
    c2.num_groups = 2;
    char path[512];
    path_of(path, sizeof path, "g2.safetensors");
    if (g_rank == 0)
        CHECK_OK(gdp_checkpoint_write_synthetic(path, &c2, 5, wt));
    if (g_mpi)
        MPI_Barrier(MPI_COMM_WORLD);
    CHECK_OK(gdp_checkpoint_open(&ck, path));
    if (ck == NULL)
        return;
    expect_load_error(ck, 0, 1, 4, "num_groups G = 2", "G % tp = 2", "G not divisible by tp");
    /* tp = 2 divides both and loads */
    gdp_layer_weights w;
    memset(&w, 0, sizeof w);
    CHECK_OK(gdp_checkpoint_load_layer_shard(ck, &w, 0, 1, 2));
    CHECK(w.shard.num_groups == 1 && w.shard.num_heads == 4, "tp 2 of G = 2, H = 8: G_t %lld, H_t %lld",
          (long long)w.shard.num_groups, (long long)w.shard.num_heads);
    gdp_layer_weights_free(&w);
    CHECK_OK(gdp_checkpoint_free(ck));
}

int main(int argc, char **argv) {
    g_mpi = argc > 1 && strcmp(argv[1], "--mpi") == 0;
    if (!g_mpi)
        exact_heap_accounting(argv);
    if (g_mpi) {
        MPI_Init(&argc, &argv);
        GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&g_comm, GDP_COMM_MPI, NULL, GDP_COMM_HOST_BUFFERS));
        MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    }
    if (g_rank == 0) {
        snprintf(g_dir, sizeof g_dir, "/tmp/gdp_ckpt_XXXXXX");
        if (mkdtemp(g_dir) == NULL)
            GDP_FATAL(g_comm, "mkdtemp(%s) failed", g_dir);
    }
    if (g_mpi)
        GDP_FATAL_IF_ERROR(g_comm, gdp_comm_host_bcast(g_comm, g_dir, sizeof g_dir, 0));

    /* H = 8, G = 4: divisible by tp = 1, 2, 4; small enough for 2 cores */
    gdp_layer_config c;
    gdp_layer_config_default(&c);
    c.hidden_size = 24;
    c.num_heads = 8;
    c.num_groups = 4;
    c.head_dim = 3;
    c.state_dim = 4;
    c.num_householder = 2;
    c.conv_width = 4;
    c.num_layers = 2;
    const gdp_dtype_t dtypes[2] = {GDP_DTYPE_BF16, GDP_DTYPE_FP32};
    char path[2][512], again[512], other[512];
    for (int d = 0; d < 2; d++) {
        path_of(path[d], sizeof path[d], d == 0 ? "bf16.safetensors" : "fp32.safetensors");
        if (g_rank == 0)
            CHECK_OK(gdp_checkpoint_write_synthetic(path[d], &c, 1234, dtypes[d]));
    }
    if (g_rank == 0) {
        /* the same seed gives the same bytes, another seed other bytes */
        path_of(again, sizeof again, "again.safetensors");
        path_of(other, sizeof other, "other.safetensors");
        CHECK_OK(gdp_checkpoint_write_synthetic(again, &c, 1234, GDP_DTYPE_BF16));
        CHECK_OK(gdp_checkpoint_write_synthetic(other, &c, 1235, GDP_DTYPE_BF16));
        CHECK(files_equal(path[0], again), "two writes with seed 1234 differ");
        CHECK(!files_equal(path[0], other), "seeds 1234 and 1235 gave the same file");
        CHECK_STATUS(gdp_checkpoint_write_synthetic(again, &c, 1, GDP_DTYPE_INT32), GDP_STATUS_INVALID_ARGUMENT);
    }
    if (g_mpi)
        MPI_Barrier(MPI_COMM_WORLD);

    for (int d = 0; d < 2; d++) {
        gdp_checkpoint_t ck = NULL;
        gdp_st_file *f = NULL;
        CHECK_OK(gdp_checkpoint_open(&ck, path[d]));
        CHECK_OK(gdp_st_open(path[d], &f));
        if (ck == NULL || f == NULL)
            break;
        gdp_layer_config got;
        gdp_dtype_t wt = GDP_DTYPE_NUM;
        CHECK_OK(gdp_checkpoint_get_config(ck, &got));
        CHECK_OK(gdp_checkpoint_get_dtype(ck, &wt));
        CHECK(memcmp(&got, &c, sizeof c) == 0, "the config read back differs from the one written");
        CHECK(wt == dtypes[d], "dtype %s read back, %s written", gdp_dtype_name(wt), gdp_dtype_name(dtypes[d]));
        test_distributions(f, &c, wt);
        const int tps_single[3] = {1, 2, 4};
        int n_tp = g_mpi ? 1 : 3;
        for (int t = 0; t < n_tp; t++) {
            int tp = g_mpi ? g_size : tps_single[t];
            CHECK_OK(gdp_checkpoint_check(ck, tp));
            for (int layer = 0; layer < c.num_layers; layer++) {
                int64_t wrong = check_layer_reassembly(ck, f, &c, layer, tp, wt);
                if (g_mpi)
                    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
                if (g_rank == 0)
                    printf("%s tp=%d layer %d: %lld tensors differ after reassembly\n", gdp_dtype_name(wt), tp, layer,
                           (long long)wrong);
            }
        }
        gdp_st_close(f);
        CHECK_OK(gdp_checkpoint_free(ck));
    }
    test_bad_checkpoints(path[0]);
    test_divisibility(path[0], &c, GDP_DTYPE_BF16);
    test_poisoned_weights(&c, GDP_DTYPE_BF16);
    test_poisoned_weights(&c, GDP_DTYPE_FP32);

    int failures = g_test_failures;
    if (g_mpi) {
        MPI_Allreduce(&g_test_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    if (g_rank == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "warning: could not remove %s\n", g_dir);
    }
    int code = (g_rank == 0 || g_test_failures) ? test_finish(g_mpi ? "test_checkpoint_mpi" : "test_checkpoint") : 0;
    if (g_mpi) {
        gdp_comm_free(g_comm);
        MPI_Finalize();
    }
    return failures ? 1 : code;
}
