/*
 * bench_common.h: what the benchmark programs (gdp-bench ops|layer|coll, bench_chunk) share,
 * in the manner of nccl-tests: one option table per benchmark (long name, short flag, type,
 * default, help) parsed in one place, with a usage text made from the table and a clear error
 * for a bad value; the clocks and statistics of the timing loops (host clock, median, warm-up
 * and timed calls between host clock reads or CUDA events); the seeded xorshift64* step behind the inputs; and
 * the table's header, column line and nccl-tests footers. Each benchmark keeps only what
 * differs: its shapes, its rows and its checks.
 */
#ifndef GDP_BENCH_COMMON_H
#define GDP_BENCH_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- the option table ---------------------------------------------------------------------- */
typedef enum bench_opt_type {
    BENCH_OPT_INT,    /* int, within [min, max]                                   */
    BENCH_OPT_CHOICE, /* const char *, one of the '|'-separated words in choices   */
    BENCH_OPT_LIST,   /* bench_list: "1,8,64", each within [min, max]              */
} bench_opt_type;

#define BENCH_MAX_LIST 32
#define BENCH_MAX_LIST_TEXT "32"
typedef struct bench_list {
    int32_t v[BENCH_MAX_LIST];
    int n;
} bench_list;

typedef struct bench_opt {
    const char    *name;    /* --name                                             */
    char           flag;    /* -f; 0: none                                        */
    bench_opt_type type;
    const char    *dflt;    /* the default as one would type it (parsed the same) */
    const char    *help;
    void          *value;   /* int *, const char ** or bench_list *               */
    long           min, max;
    const char    *choices; /* BENCH_OPT_CHOICE: "auto|cpu|cuda"                  */
} bench_opt;

/* The most options a benchmark's table holds (its table functions assert it). */
#define BENCH_MAX_OPTS 20

enum { BENCH_PARSE_OK = 0, BENCH_PARSE_HELP = 1, BENCH_PARSE_ERROR = 2 };

/* Sets every option to its default, then parses argv[first..argc) ("--name V", "-f V"; -h or
 * --help prints the usage). BENCH_PARSE_OK; BENCH_PARSE_HELP after printing the usage to
 * stdout (when print_usage); BENCH_PARSE_ERROR after printing to stderr what is wrong: an
 * unknown option, a missing value, or a value that is not of the option's type or range. */
int bench_parse(const char *prog, const char *synopsis, const bench_opt *opts, int n_opts, int argc, char **argv,
                int first, bool print_usage);
/* "usage: <prog> <synopsis>" and one line per option: flags, value, help, default. */
void bench_usage(FILE *f, const char *prog, const char *synopsis, const bench_opt *opts, int n_opts);

/* ---- clocks and statistics ----------------------------------------------------------------- */
double bench_now_s(void); /* the monotonic host clock, seconds */
void bench_sort(double *v, int n);
/* Sorts v; the middle value (the mean of the two middle ones for even n). */
double bench_median(double *v, int n);

/* xorshift64*: one step of the state, the output word (seed the state with a non-zero value). */
static inline uint64_t bench_xorshift64s(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* One timed call: 0, or non-zero to stop timing (a failure the callee has reported). */
typedef int (*bench_call_fn)(void *arg);
/* Runs warmup + iters calls of call(arg) timed by the host clock (call waits for its own
 * work; before(arg) first, outside the clock, when given: a barrier); the timed calls'
 * seconds in seconds[0..iters). 0, or the first non-zero return of either. */
int bench_time_host(int warmup, int iters, bench_call_fn call, bench_call_fn before, void *arg, double *seconds);

#ifdef GDP_HAVE_CUDA
/* Runs warmup + iters calls of call(arg) on stream, each between two events and waited for
 * (before(arg) first, outside the events, when given: an L2 flush); the timed calls' times in
 * us[0..iters). 0; the call's non-zero return; or -1 after a failed CUDA call (printed with
 * prog). */
int bench_time_events(const char *prog, cudaStream_t stream, int warmup, int iters, bench_call_fn call,
                      bench_call_fn before, void *arg, double *us);
#endif

/* ---- the table ----------------------------------------------------------------------------- */
/* "X.Y.Z" of the linked libgdp. */
void bench_version(char *buf, size_t n);
/* A column of the table: its title and printf width (negative: left-aligned). */
typedef struct bench_col {
    const char *title;
    int width;
} bench_col;
/* lead, then the titles separated by one space, then a newline. */
void bench_print_columns(const char *lead, const bench_col *cols, int n_cols);
/* A '#' line under a row: the chunk op's time by stage (us[GDP_CHUNK_STAGE_NUM], gdp/profile.h;
 * stages at 0 left out), `what` naming how it was measured, and their sum beside the row's
 * time. Nothing when every stage is 0. */
void bench_print_chunk_stages(const char *what, const double *us, double row_us);

/* nccl-tests' footers: "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth    : X". */
void bench_print_wrong_footer(long long wrong);
void bench_print_busbw_footer(double avg_busbw);

/* ---- the benchmarks of gdp-bench (examples/bench_layer.c: layer and coll, under mpirun) ---- */
int gdp_bench_layer_main(int argc, char **argv);
int gdp_bench_coll_main(int argc, char **argv);

#endif /* GDP_BENCH_COMMON_H */
