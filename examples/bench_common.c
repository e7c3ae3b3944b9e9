/*
 * bench_common.c: the benchmarks' shared scaffolding (see bench_common.h): the option table's
 * parser and usage text, the host clock and median, CUDA-event timing of warm-up and timed
 * calls, and the table's columns and footers.
 */
#include "bench_common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdp/gdp.h"
#include "gdp/profile.h"

/* ---- the option table ---------------------------------------------------------------------- */

/* v as a long within [min, max]; false when it is not a whole number or out of range. */
static bool parse_long(const char *v, long min, long max, long *out) {
    char *end = NULL;
    errno = 0;
    const long x = strtol(v, &end, 10);
    if (errno || end == v || *end != '\0' || x < min || x > max)
        return false;
    *out = x;
    return true;
}

static bool parse_choice(const char *v, const char *choices) {
    const size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        const size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && n > 0 && strncmp(p, v, len) == 0)
            return true;
        p += len + (bar != NULL);
    }
    return false;
}

/* "1,8,64": at most BENCH_MAX_LIST whole numbers in [min, max], comma-separated. */
static bool parse_list(const char *v, long min, long max, bench_list *out, const char **why) {
    bench_list l = {.n = 0};
    const char *p = v;
    *why = "a list of whole numbers separated by commas";
    if (*p == '\0') { /* "": no entries */
        *out = l;
        return true;
    }
    do {
        char *end = NULL;
        errno = 0;
        const long x = strtol(p, &end, 10);
        if (errno || end == p || (*end != ',' && *end != '\0'))
            return false;
        if (x < min || x > max) {
            *why = "a list whose every entry is in range";
            return false;
        }
        if (l.n == BENCH_MAX_LIST) {
            *why = "a list of at most " BENCH_MAX_LIST_TEXT " entries";
            return false;
        }
        l.v[l.n++] = (int32_t)x;
        p = *end == ',' ? end + 1 : end;
    } while (*p != '\0');
    *out = l;
    return true;
}

/* Applies value v to option o; false after printing why it does not fit. */
static bool set_value(const char *prog, const bench_opt *o, const char *v) {
    const char *why = "";
    switch (o->type) {
    case BENCH_OPT_INT: {
        long x = 0;
        if (parse_long(v, o->min, o->max, &x)) {
            *(int *)o->value = (int)x;
            return true;
        }
        fprintf(stderr, "%s: --%s '%s': want a whole number in [%ld, %ld] (try --help)\n", prog, o->name, v, o->min,
                o->max);
        return false;
    }
    case BENCH_OPT_CHOICE:
        if (parse_choice(v, o->choices)) {
            *(const char **)o->value = v;
            return true;
        }
        fprintf(stderr, "%s: --%s '%s': want one of %s (try --help)\n", prog, o->name, v, o->choices);
        return false;
    case BENCH_OPT_LIST:
        if (parse_list(v, o->min, o->max, (bench_list *)o->value, &why))
            return true;
        fprintf(stderr, "%s: --%s '%s': want %s, each in [%ld, %ld] (try --help)\n", prog, o->name, v, why, o->min,
                o->max);
        return false;
    }
    return false;
}

static const bench_opt *find_opt(const bench_opt *opts, int n_opts, const char *arg) {
    for (int k = 0; k < n_opts; k++) {
        if (arg[0] == '-' && arg[1] == '-' && strcmp(arg + 2, opts[k].name) == 0)
            return &opts[k];
        if (arg[0] == '-' && opts[k].flag != 0 && arg[1] == opts[k].flag && arg[2] == '\0')
            return &opts[k];
    }
    return NULL;
}

int bench_parse(const char *prog, const char *synopsis, const bench_opt *opts, int n_opts, int argc, char **argv,
                int first, bool print_usage) {
    for (int k = 0; k < n_opts; k++)
        if (!set_value(prog, &opts[k], opts[k].dflt))
            return BENCH_PARSE_ERROR; /* a default outside its own range: a bug in the table */
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (print_usage)
                bench_usage(stdout, prog, synopsis, opts, n_opts);
            return BENCH_PARSE_HELP;
        }
        const bench_opt *o = find_opt(opts, n_opts, a);
        if (o == NULL) {
            fprintf(stderr, "%s: unknown option '%s' (try --help)\n", prog, a);
            return BENCH_PARSE_ERROR;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value (try --help)\n", prog, a);
            return BENCH_PARSE_ERROR;
        }
        if (!set_value(prog, o, argv[++i]))
            return BENCH_PARSE_ERROR;
    }
    return BENCH_PARSE_OK;
}

void bench_usage(FILE *f, const char *prog, const char *synopsis, const bench_opt *opts, int n_opts) {
    fprintf(f, "usage: %s %s\n", prog, synopsis);
    for (int k = 0; k < n_opts; k++) {
        const bench_opt *o = &opts[k];
        const char *value = o->type == BENCH_OPT_CHOICE ? o->choices : o->type == BENCH_OPT_LIST ? "LIST" : "N";
        char flags[160];
        if (o->flag)
            snprintf(flags, sizeof flags, "-%c, --%s %s", o->flag, o->name, value);
        else
            snprintf(flags, sizeof flags, "    --%s %s", o->name, value);
        fprintf(f, "  %-28s %s (default %s)\n", flags, o->help, o->dflt[0] ? o->dflt : "none");
    }
}

/* ---- clocks and statistics ----------------------------------------------------------------- */

double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_sort(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_double); }

double bench_median(double *v, int n) {
    bench_sort(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int bench_time_host(int warmup, int iters, bench_call_fn call, bench_call_fn before, void *arg, double *seconds) {
    for (int i = 0; i < warmup + iters; i++) {
        int rc = before != NULL ? before(arg) : 0;
        if (rc != 0)
            return rc;
        const double t0 = bench_now_s();
        rc = call(arg);
        const double t = bench_now_s() - t0;
        if (rc != 0)
            return rc;
        if (i >= warmup)
            seconds[i - warmup] = t;
    }
    return 0;
}

#ifdef GDP_HAVE_CUDA
static bool cuda_ok(const char *prog, cudaError_t e, const char *what) {
    if (e == cudaSuccess)
        return true;
    fprintf(stderr, "%s: %s failed: %s\n", prog, what, cudaGetErrorString(e));
    return false;
}

int bench_time_events(const char *prog, cudaStream_t stream, int warmup, int iters, bench_call_fn call,
                      bench_call_fn before, void *arg, double *us) {
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = 0;
    if (!cuda_ok(prog, cudaEventCreate(&e0), "cudaEventCreate") ||
        !cuda_ok(prog, cudaEventCreate(&e1), "cudaEventCreate"))
        rc = -1;
    for (int i = 0; rc == 0 && i < warmup + iters; i++) {
        if (before != NULL && (rc = before(arg)) != 0)
            break;
        if (!cuda_ok(prog, cudaEventRecord(e0, stream), "cudaEventRecord")) {
            rc = -1;
            break;
        }
        const int st = call(arg);
        if (!cuda_ok(prog, cudaEventRecord(e1, stream), "cudaEventRecord") ||
            !cuda_ok(prog, cudaEventSynchronize(e1), "cudaEventSynchronize")) {
            rc = -1;
            break;
        }
        if (st != 0) {
            rc = st;
            break;
        }
        float ms = 0;
        if (!cuda_ok(prog, cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime")) {
            rc = -1;
            break;
        }
        if (i >= warmup)
            us[i - warmup] = 1e3 * (double)ms;
    }
    if (e0 != NULL)
        cudaEventDestroy(e0);
    if (e1 != NULL)
        cudaEventDestroy(e1);
    return rc;
}
#endif

/* ---- the table ----------------------------------------------------------------------------- */

void bench_version(char *buf, size_t n) {
    int version = 0;
    gdp_get_version(&version);
    snprintf(buf, n, "%d.%d.%d", version / 10000, version / 100 % 100, version % 100);
}

void bench_print_columns(const char *lead, const bench_col *cols, int n_cols) {
    fputs(lead, stdout);
    for (int c = 0; c < n_cols; c++)
        printf(c ? " %*s" : "%*s", cols[c].width, cols[c].title);
    putchar('\n');
}

void bench_print_chunk_stages(const char *what, const double *us, double row_us) {
    double sum = 0;
    for (int s = 0; s < GDP_CHUNK_STAGE_NUM; s++)
        sum += us[s];
    if (sum <= 0)
        return;
    printf("#   chunk stages (us, %s):", what);
    for (int s = 0; s < GDP_CHUNK_STAGE_NUM; s++)
        if (us[s] > 0)
            printf(" %s %.1f", gdp_chunk_stage_name((gdp_chunk_stage_t)s), us[s]);
    printf("; sum %.1f of the row's %.1f\n", sum, row_us);
}

void bench_print_wrong_footer(long long wrong) {
    printf("# Out of bounds values : %lld %s\n", wrong, wrong == 0 ? "OK" : "FAILED");
}

void bench_print_busbw_footer(double avg_busbw) { printf("# Avg bus bandwidth    : %g\n#\n", avg_busbw); }
