/*
 * gdp_run.c: gdp-run, the main program. Under mpirun (launch/gdp-run starts it) it serves
 * a stream of requests through a GDP language model on every rank of one tensor-parallel
 * group and reports how it went:
 *
 *   gdp-run [--model CKPT] [--workload FILE.jsonl | synthetic:SPEC] [engine options]
 *
 * With no arguments it runs an embedded default: a seeded synthetic model (D 256, 2 layers,
 * H 8, G 2, P 32, N 64, M 2, vocab 512) written at start-up into a temporary directory
 * (one copy per node), and a synthetic workload of 32 requests. The backend is CUDA with
 * NCCL where the build and the machine have a GPU, else the CPU backend with MPI.
 * --check repeats the walk-through's self check: the logits of each checked request's last
 * decode step against recomputing its whole sequence with one prefill.
 * docs/gdp-run.md describes every option, the workload format and the report;
 * docs/failures.md what it guarantees when things go wrong: output paths checked before
 * the run, results streamed to --output as each request finishes, the watchdog
 * (--watchdog) and what SIGTERM/SIGINT report.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <jansson.h> /* defines: json_pack, json_dumps (the --output lines) */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gdp/checkpoint.h"
#include "gdp/comm.h"
#include "gdp/engine.h"
#include "gdp/model.h"

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime_api.h> /* defines: cudaStreamCreateWithFlags (CUDA graphs need a stream of our own) */
#endif

typedef struct options {
    const char *model, *workload, *output, *write_model, *backend;
    gdp_layer_config cfg;   /* the embedded synthetic model */
    bool heads_set, groups_set; /* given on the command line: never adjusted */
    uint64_t model_seed, prompt_seed;
    gdp_engine_config engine;
    int32_t check;          /* requests to check, 0: no check */
    int32_t cp;             /* context-parallel size (docs/cp.md); tp = ranks / cp */
    double  watchdog;       /* step timeout in seconds (< 0: GDP_WATCHDOG_TIMEOUT or the default) */
    bool no_finite_check;   /* load weights even if they hold NaN / Inf */
    gdp_workload_limits limits; /* --max-requests, --max-prompt-len, --max-new-tokens, --max-arrival */
    gdp_request_defaults defaults; /* --temperature, --top-k, --top-p, --sampling-seed, --stop */
} options;

static int g_rank = 0, g_size = 1;
static gdp_comm_t g_job_comm; /* for gdp_fatal's ncclCommAbort once the watchdog fired */

/* ---- outputs (docs/failures.md) ---------------------------------------------------------
 * --output is opened before the model is loaded (an unwritable path fails at once, with
 * the errno text), truncated, and grows by one JSON line per finished request, written
 * with one write(2) as the request finishes (the engine's on_result): a killed run keeps
 * every line of the requests that finished. What the signal handler reads is plain
 * volatile data. */
typedef struct results_out {
    const char    *path;
    int            fd;        /* -1: no --output */
    bool           regular;   /* a regular file: fsync'ed at the end */
    int            err;       /* errno of the first failed write (the rest is then skipped) */
    int32_t        n;         /* requests of the workload */
    unsigned char *written;   /* [n]: the line of request i is in the file */
} results_out;
static results_out g_out = {.fd = -1};
static volatile sig_atomic_t g_finished, g_lines; /* requests finished / lines in --output */
static pthread_t g_main_thread; /* the thread that writes --output; on_signal reports from it */

/* SIGTERM and SIGINT held off the calling thread (block) or let through again: around a
 * result's write and its counts, so the signal message never sees a line on disk that
 * g_lines does not count yet (or the reverse). */
static void hold_signals(bool block) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}
static volatile sig_atomic_t g_total = -1;         /* requests of the workload, -1: not loaded */
static const char *volatile g_phase = "starting";  /* what the program is doing */

/* Refuses what cannot hold a file we write; "cannot write PATH: REASON" in why. */
static bool check_output_path(const char *path, char *why, size_t n) {
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode) || S_ISBLK(sb.st_mode) || S_ISSOCK(sb.st_mode)) {
            snprintf(why, n, "cannot write %s: it is a %s", path,
                     S_ISDIR(sb.st_mode) ? "directory" : S_ISBLK(sb.st_mode) ? "block device" : "socket");
            return false;
        }
        if (access(path, W_OK) != 0) {
            snprintf(why, n, "cannot write %s: %s", path, strerror(errno));
            return false;
        }
        return true;
    }
    if (errno != ENOENT) {
        snprintf(why, n, "cannot write %s: %s", path, strerror(errno));
        return false;
    }
    /* a new file: its directory must exist and be writable */
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (slash == path ? 1 : (int)(slash - path)) : 1, slash ? path : ".");
    if (access(dir, W_OK | X_OK) != 0) {
        const int e = errno;
        snprintf(why, n, "cannot write %s: %s (%s %.900s)", path, strerror(e),
                 e == ENOENT ? "there is no directory" : "in the directory", dir);
        return false;
    }
    return true;
}

/* Opens --output for streaming (truncates a file; a FIFO must have a reader). */
static bool results_open(const char *path, char *why, size_t n) {
    if (!check_output_path(path, why, n))
        return false;
    struct stat sb;
    const bool exists = stat(path, &sb) == 0;
    const bool fifo = exists && S_ISFIFO(sb.st_mode);
    int fd = open(path, O_WRONLY | O_CLOEXEC | (fifo ? O_NONBLOCK : O_CREAT | O_TRUNC), 0666);
    if (fd < 0) {
        snprintf(why, n, "cannot write %s: %s%s", path, strerror(errno),
                 fifo && errno == ENXIO ? " (a FIFO that no process reads)" : "");
        return false;
    }
    if (fifo)
        (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); /* writes wait for the reader */
    g_out.path = path;
    g_out.fd = fd;
    g_out.regular = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode);
    if (!g_out.regular)
        signal(SIGPIPE, SIG_IGN); /* a FIFO whose reader left: EPIPE, reported, not a silent death */
    return true;
}

static const char *finish_reason_name(int32_t reason) {
    switch (reason) {
    case GDP_FINISH_LENGTH: return "length";
    case GDP_FINISH_STOP: return "stop";
    case GDP_FINISH_ERROR: return "error";
    default: return "unknown";
    }
}

/* One request's line, as gdp_engine_write_results writes it: {"id", "prompt_len", "tokens",
 * "ttft_s", "latency_s", "preemptions", "finish"} plus "error" for a failed request;
 * written with one write(2), so a signal never leaves half a line. */
static void results_write(const gdp_request_result *r) {
    if (g_out.fd < 0 || g_out.err != 0 || r->index < 0 || r->index >= g_out.n || g_out.written[r->index])
        return;
    json_t *toks = json_array();
    for (int32_t k = 0; toks != NULL && k < r->n_generated; k++)
        json_array_append_new(toks, json_integer(r->tokens[k]));
    json_t *o = json_pack("{s:I, s:i, s:o, s:f, s:f, s:i, s:s}", "id", (json_int_t)r->id, "prompt_len",
                          r->prompt_len, "tokens", toks, "ttft_s", r->first_token_s - r->arrival_s, "latency_s",
                          r->finish_s - r->arrival_s, "preemptions", r->preemptions, "finish",
                          finish_reason_name(r->finish_reason));
    if (o != NULL && r->finish_reason == GDP_FINISH_ERROR)
        json_object_set_new(o, "error", json_string(r->error ? r->error : ""));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    hold_signals(true); /* the line and g_lines change together (on_signal) */
    if (text == NULL) {
        g_out.err = ENOMEM;
    } else {
        const size_t len = strlen(text);
        text[len] = '\n'; /* json_dumps leaves the NUL there: one buffer, one write */
        for (size_t done = 0; done <= len && g_out.err == 0;) {
            ssize_t k = write(g_out.fd, text + done, len + 1 - done);
            if (k < 0 && errno != EINTR)
                g_out.err = errno;
            else if (k > 0)
                done += (size_t)k;
        }
        free(text);
    }
    if (g_out.err == 0) {
        g_out.written[r->index] = 1;
        g_lines = g_lines + 1;
    }
    hold_signals(false);
    if (g_out.err != 0)
        fprintf(stderr, "gdp-run: writing %s failed after %d results: %s; the run goes on, the rest of its results "
                "are not written\n", g_out.path, (int)g_lines, strerror(g_out.err));
}

/* The engine's on_result (root): each request as it finishes. */
static void on_result(const gdp_request_result *result, void *user) {
    (void)user;
    g_finished = g_finished + 1;
    results_write(result);
}

/* Syncs and closes --output; false (message printed) when something was not written. */
static bool results_close(void) {
    if (g_out.fd < 0)
        return true;
    int err = g_out.err;
    if (err == 0 && g_out.regular && fsync(g_out.fd) != 0)
        err = errno; /* delayed allocation: a full disk may show only here */
    if (close(g_out.fd) != 0 && err == 0)
        err = errno;
    g_out.fd = -1;
    if (err != 0 && err != g_out.err)
        fprintf(stderr, "gdp-run: writing %s failed: %s\n", g_out.path, strerror(err));
    if (err != 0)
        fprintf(stderr, "gdp-run: %s holds %d of %d results (the run's other results are lost)\n", g_out.path,
                (int)g_lines, g_out.n);
    return err == 0;
}

/* ---- signals: SIGTERM / SIGINT say what was interrupted and what was written --------------
 * Only async-signal-safe calls: the message is assembled by hand and written with write(2);
 * then the default action ends the process (mpirun turns Ctrl-C into SIGTERM for the ranks). */
static size_t put_text(char *b, size_t at, size_t cap, const char *s) {
    while (s != NULL && *s && at + 1 < cap)
        b[at++] = *s++;
    return at;
}

static size_t put_num(char *b, size_t at, size_t cap, long long v) {
    char d[24];
    int k = 0;
    const bool neg = v < 0;
    unsigned long long u = neg ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        d[k++] = (char)('0' + u % 10);
        u /= 10;
    } while (u && k < 23);
    if (neg && at + 1 < cap)
        b[at++] = '-';
    while (k > 0 && at + 1 < cap)
        b[at++] = d[--k];
    return at;
}

static void on_signal(int sig) {
    /* A process-directed signal may land on any thread without it blocked (MPI's, CUDA's):
     * hand it to the main thread, which holds it off while a result is half counted. */
    if (!pthread_equal(pthread_self(), g_main_thread)) {
        pthread_kill(g_main_thread, sig);
        return;
    }
    if (g_rank == 0) {
        char m[1024];
        const size_t c = sizeof m;
        size_t at = put_text(m, 0, c, "gdp-run: ended by ");
        at = put_text(m, at, c, sig == SIGINT ? "SIGINT" : "SIGTERM");
        at = put_text(m, at, c, " (Ctrl-C or kill; mpirun also sends it when a rank aborts) while ");
        at = put_text(m, at, c, g_phase);
        int64_t step = -1;
        gdp_watchdog_get_step(&step);
        if (step >= 0) {
            at = put_text(m, at, c, ", at step ");
            at = put_num(m, at, c, step);
        }
        if (g_total >= 0) {
            at = put_text(m, at, c, ": ");
            at = put_num(m, at, c, g_finished);
            at = put_text(m, at, c, " of ");
            at = put_num(m, at, c, g_total);
            at = put_text(m, at, c, " requests finished");
        }
        if (g_out.path != NULL) {
            at = put_text(m, at, c, "; ");
            at = put_num(m, at, c, g_lines);
            at = put_text(m, at, c, " of their results are in ");
            at = put_text(m, at, c, g_out.path);
            at = put_text(m, at, c, " (one complete JSON line each)");
        } else {
            at = put_text(m, at, c, "; nothing was written (no --output)");
        }
        at = put_text(m, at, c, "\n");
        ssize_t ignored = write(2, m, at);
        (void)ignored;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* gdp_fatal's callback: the abort's own SIGTERM from mpirun must not be reported as an
 * interruption by this rank, and --output's state is said once. */
static void on_abort(void *user) {
    (void)user;
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    if (g_rank == 0 && g_out.path != NULL)
        fprintf(stderr, "gdp-run: %d finished requests' results are in %s\n", (int)g_lines, g_out.path);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: gdp-run [options]   (normally started by launch/gdp-run, which runs mpirun)\n"
            "model:\n"
            "  --model PATH            gdp checkpoint with a vocabulary (default: a synthetic model written at start-up)\n"
            "  --layers L --hidden D --heads H --groups G --head-dim P --state-dim N --householder M --vocab V\n"
            "  --model-seed S          config and seed of the synthetic model (default L 2, D 256, H 8, G 2, P 32,\n"
            "                          N 64, M 2, vocab 512, seed 1234)\n"
            "  --write-model PATH      write that synthetic checkpoint (fp32) to PATH and exit\n"
            "  --no-finite-check       load weights even if they hold NaN or Inf (the load refuses them by default)\n"
            "workload:\n"
            "  --workload FILE.jsonl   requests, one JSON object per line (docs/gdp-run.md)\n"
            "  --workload synthetic:n=32,rate=0,prompt=16-300,new=32,repeat=0.3,seed=1   (the default;\n"
            "                          rate = arrivals per second, 0 = all at the start)\n"
            "  --prompt-seed S         seed of prompts a JSONL file gives as a length (default 1)\n"
            "  --no-arrivals           every request arrives at the start (ignore arrival times)\n"
            "  --max-requests N        refuse a workload of more than N requests (1000000)\n"
            "  --max-prompt-len N      refuse a prompt longer than N tokens (1048576)\n"
            "  --max-new-tokens N      refuse a request asking for more than N new tokens (1048576)\n"
            "  --max-arrival S         refuse an arrival later than S seconds (86400; ignored with --no-arrivals)\n"
            "sampling (every request that does not set its own; docs/gdp-run.md):\n"
            "  --temperature T         0 = greedy (0); --top-k K (0 = off); --top-p P (1 = off)\n"
            "  --sampling-seed S       base seed: a request without its own seed draws with a mix of S and its id (0)\n"
            "  --stop ID,ID,..         stop token ids: generation ends after one of them (none)\n"
            "engine:\n"
            "  --backend auto|cpu|cuda auto: CUDA + NCCL when built with CUDA and a GPU is there, else CPU + MPI\n"
            "  --slots N               state slots, i.e. requests running at once (16)\n"
            "  --budget N              tokens per step, decode + prefill (512)\n"
            "  --prefill-chunk N       prefill slice, a multiple of 64; 0 = whole prompts (256)\n"
            "  --draft K               n-gram draft tokens per decode step, 0 = off (0)\n"
            "  --ngram N               longest n-gram the drafter matches (3)\n"
            "  --no-preempt            never preempt; --preempt-after N: decode steps before a request may be (16)\n"
            "  --preempt-wait-ms MS    a waiting request's turn comes (a running one is swapped out for it) after\n"
            "                          waiting this long for a slot; 0 = at once (2000)\n"
            "  --swap-memory device|host  where a preempted request's state waits on CUDA: device memory\n"
            "                          (copies in stream order, no host wait) or pinned host memory (device)\n"
            "  --schedule fcfs|shortest  admission order of waiting requests: arrival, or shortest prompt first\n"
            "                          (shortest)\n"
            "  --schedule-age-ms MS    with shortest: a request that waited this long goes first, in arrival\n"
            "                          order (2000)\n"
            "  --max-candidates N      sampling candidates per rank and row: the largest top_k, top-p's reach (256)\n"
            "  --ssm-state fp32|bf16   the cache's recurrent state dtype: bf16 halves the decode step's state\n"
            "                          bytes and adds a drift (docs/gdp-run.md, \"The state dtype\") (fp32)\n"
            "  --no-graphs             run every step eagerly (no CUDA graphs)\n"
            "  --lazy-graphs           capture each step shape's graph at its first step (default: every\n"
            "                          shape at start-up, so no step waits for a capture)\n"
            "  --no-overlap            compose each step after the last one finished (default: the\n"
            "                          host composes step n + 1 while the device runs step n)\n"
            "  --progress S            seconds between progress lines on stderr, 0 = none (1)\n"
            "  --watchdog S            step timeout: a rank waiting longer for a peer ends the job naming it; 0 = off\n"
            "                          (GDP_WATCHDOG_TIMEOUT, else 300; docs/failures.md)\n"
            "  --debug-check           hash-check every step's metadata across ranks\n"
            "  --cp C                  context parallelism: the ranks form tp = ranks / C TP groups x C, each layer\n"
            "                          core on H/(tp*C) heads of every row (docs/cp.md); CUDA then uses the MPI comm (1)\n"
            "output:\n"
            "  --output FILE           each request's generated tokens, JSONL, one line as each request finishes\n"
            "  --check [N]             decode vs recompute self check on the first N requests (4; 0 = off)\n"
            "  -h, --help\n");
}

/* A call whose outcome every rank shares (the library agreed on it): rank 0 prints the
 * message, every rank leaves with status 1. */
static void exit_if_failed(gdp_status_t st, const char *what) {
    if (st == GDP_STATUS_SUCCESS)
        return;
    if (gdp_watchdog_fired()) {
        /* A peer is stalled: no collective can complete, so this rank ends the job. The other
         * ranks give rank 0 a moment to report first (one message when rank 0 is alive). */
        if (g_rank != 0)
            sleep(1);
        GDP_FATAL(g_job_comm, "gdp-run: rank %d: %s failed: %s", g_rank, what, gdp_last_error());
    }
    if (g_rank == 0 && g_out.path != NULL) {
        results_close();
        fprintf(stderr, "gdp-run: %d finished requests' results are in %s\n", (int)g_lines, g_out.path);
    }
    /* Every rank failed together. A rank whose own error differs in kind from rank 0's
     * (rank 0 only heard of it remotely) prints it too; identical errors print once. */
    int root_st = st;
    MPI_Bcast(&root_st, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (g_rank == 0 || (st != GDP_STATUS_REMOTE_ERROR && root_st == GDP_STATUS_REMOTE_ERROR))
        fprintf(stderr, "gdp-run: rank %d: %s failed: %s\n  %s\n", g_rank, what, gdp_status_string(st),
                gdp_last_error());
    MPI_Finalize();
    exit(1);
}

static bool parse_int(const char *s, long lo, long hi, int32_t *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = (int32_t)v;
    return true;
}

/* Returns 0 on success, 2 on a bad command line (message printed by rank 0). */
static int parse_args(int argc, char **argv, options *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int32_t n = 0;
#define NEED_VALUE()                                                                      \
    do {                                                                                  \
        if (v == NULL) {                                                                  \
            if (g_rank == 0)                                                              \
                fprintf(stderr, "gdp-run: %s needs a value (try --help)\n", a);           \
            return 2;                                                                     \
        }                                                                                 \
        i++;                                                                              \
    } while (0)
#define INT_OPT(name, lo, hi, dst)                                                        \
    if (!strcmp(a, name)) {                                                               \
        NEED_VALUE();                                                                     \
        if (!parse_int(v, lo, hi, &n)) {                                                  \
            if (g_rank == 0)                                                              \
                fprintf(stderr, "gdp-run: %s %s: expected an integer in [%ld, %ld]\n", a, v, (long)(lo), (long)(hi)); \
            return 2;                                                                     \
        }                                                                                 \
        dst = n;                                                                          \
        continue;                                                                         \
    }
/* An option of two spellings, s0 (value v0) and s1 (v1); anything else is refused naming both. */
#define CHOICE_OPT(name, s0, v0, s1, v1, dst)                                             \
    if (!strcmp(a, name)) {                                                               \
        NEED_VALUE();                                                                     \
        if (!strcmp(v, s0) || !strcmp(v, s1)) {                                           \
            dst = !strcmp(v, s0) ? (v0) : (v1);                                           \
            continue;                                                                     \
        }                                                                                 \
        if (g_rank == 0)                                                                  \
            fprintf(stderr, "gdp-run: %s %s: expected %s or %s\n", a, v, s0, s1);         \
        return 2;                                                                         \
    }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (g_rank == 0)
                usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--model")) { NEED_VALUE(); o->model = v; continue; }
        if (!strcmp(a, "--write-model")) { NEED_VALUE(); o->write_model = v; continue; }
        if (!strcmp(a, "--workload")) { NEED_VALUE(); o->workload = v; continue; }
        if (!strcmp(a, "--output")) { NEED_VALUE(); o->output = v; continue; }
        if (!strcmp(a, "--backend")) { NEED_VALUE(); o->backend = v; continue; }
        INT_OPT("--layers", 1, 1 << 16, o->cfg.num_layers)
        INT_OPT("--hidden", 1, 1 << 20, o->cfg.hidden_size)
        if (!strcmp(a, "--heads"))
            o->heads_set = true;
        if (!strcmp(a, "--groups"))
            o->groups_set = true;
        INT_OPT("--heads", 1, 1 << 16, o->cfg.num_heads)
        INT_OPT("--groups", 1, 1 << 16, o->cfg.num_groups)
        INT_OPT("--head-dim", 1, 256, o->cfg.head_dim)
        INT_OPT("--state-dim", 1, 256, o->cfg.state_dim)
        INT_OPT("--householder", 1, 16, o->cfg.num_householder)
        INT_OPT("--vocab", 2, 1 << 24, o->cfg.vocab_size)
        INT_OPT("--slots", 1, 1 << 16, o->engine.n_slots)
        INT_OPT("--budget", 1, 1 << 24, o->engine.max_step_tokens)
        INT_OPT("--prefill-chunk", 0, 1 << 24, o->engine.prefill_chunk)
        INT_OPT("--draft", 0, 15, o->engine.draft_tokens)
        INT_OPT("--ngram", 2, 64, o->engine.ngram)
        INT_OPT("--preempt-after", 1, 1 << 20, o->engine.preempt_after)
        INT_OPT("--preempt-wait-ms", 0, 1 << 30, o->engine.preempt_wait_ms)
        INT_OPT("--schedule-age-ms", 0, 1 << 30, o->engine.schedule_age_ms)
        CHOICE_OPT("--schedule", "fcfs", GDP_SCHEDULE_FCFS, "shortest", GDP_SCHEDULE_SHORTEST, o->engine.schedule)
        CHOICE_OPT("--swap-memory", "host", 0, "device", 1, o->engine.swap_on_device)
        CHOICE_OPT("--ssm-state", "fp32", GDP_DTYPE_FP32, "bf16", GDP_DTYPE_BF16, o->engine.ssm_dtype)
        INT_OPT("--max-candidates", 1, GDP_SAMPLING_MAX_CANDIDATES, o->engine.max_candidates)
        INT_OPT("--progress", 0, 3600, o->engine.progress)
        INT_OPT("--cp", 1, 1 << 16, o->cp)
        if (!strcmp(a, "--watchdog")) {
            NEED_VALUE();
            char *end = NULL;
            errno = 0;
            const double t = strtod(v, &end);
            if (errno || end == v || *end || !(t >= 0) || t > 1e9) {
                if (g_rank == 0)
                    fprintf(stderr, "gdp-run: --watchdog %s: expected seconds in [0, 1e9] (0 turns it off)\n", v);
                return 2;
            }
            o->watchdog = t;
            continue;
        }
        INT_OPT("--max-requests", 1, INT32_MAX, o->limits.max_requests)
        INT_OPT("--max-prompt-len", 1, INT32_MAX, o->limits.max_prompt_len)
        INT_OPT("--max-new-tokens", 1, INT32_MAX, o->limits.max_new_tokens)
        if (!strcmp(a, "--max-arrival")) {
            NEED_VALUE();
            char *end = NULL;
            errno = 0;
            const double d = strtod(v, &end);
            if (errno || end == v || *end || !(d >= 0) || d > 1e300) {
                if (g_rank == 0)
                    fprintf(stderr, "gdp-run: --max-arrival %s: expected a finite number of seconds >= 0\n", v);
                return 2;
            }
            o->limits.max_arrival_s = d;
            continue;
        }
        if (!strcmp(a, "--no-finite-check")) { o->no_finite_check = true; continue; }
        INT_OPT("--top-k", 0, GDP_SAMPLING_MAX_CANDIDATES, o->defaults.sampling.top_k)
        if (!strcmp(a, "--temperature") || !strcmp(a, "--top-p")) {
            NEED_VALUE();
            char *end = NULL;
            errno = 0;
            const double d = strtod(v, &end);
            const bool temp = a[2] == 't' && a[3] == 'e';
            if (errno || end == v || *end || !(d >= 0) || (temp ? !(d < 1e30) : d > 1)) {
                if (g_rank == 0)
                    fprintf(stderr, "gdp-run: %s %s: expected %s\n", a, v,
                            temp ? "a finite number >= 0 (0 = greedy)" : "a number in (0, 1] (1 = off)");
                return 2;
            }
            *(temp ? &o->defaults.sampling.temperature : &o->defaults.sampling.top_p) = (float)d;
            continue;
        }
        if (!strcmp(a, "--stop")) {
            NEED_VALUE();
            o->defaults.n_stop = 0;
            for (const char *c = v; *c;) {
                char *end = NULL;
                errno = 0;
                const long id = strtol(c, &end, 10);
                if (errno || end == c || id < 0 || id > INT32_MAX || o->defaults.n_stop >= GDP_MAX_STOP_TOKENS ||
                    (*end != ',' && *end != '\0')) {
                    if (g_rank == 0)
                        fprintf(stderr, "gdp-run: --stop %s: expected up to %d token ids separated by commas\n", v,
                                GDP_MAX_STOP_TOKENS);
                    return 2;
                }
                o->defaults.stop[o->defaults.n_stop++] = (int32_t)id;
                c = *end == ',' ? end + 1 : end;
            }
            continue;
        }
        if (!strcmp(a, "--model-seed") || !strcmp(a, "--prompt-seed") || !strcmp(a, "--sampling-seed")) {
            NEED_VALUE();
            char *end = NULL;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end) {
                if (g_rank == 0)
                    fprintf(stderr, "gdp-run: %s %s: expected an unsigned integer\n", a, v);
                return 2;
            }
            *(a[2] == 'm' ? &o->model_seed : a[2] == 'p' ? &o->prompt_seed : &o->defaults.sampling.seed) = s;
            continue;
        }
        if (!strcmp(a, "--no-arrivals")) { o->engine.honor_arrivals = 0; continue; }
        if (!strcmp(a, "--no-preempt")) { o->engine.preempt = 0; continue; }
        if (!strcmp(a, "--no-graphs")) { o->engine.cuda_graphs = 0; continue; }
        if (!strcmp(a, "--lazy-graphs")) { o->engine.graphs_at_init = 0; continue; }
        if (!strcmp(a, "--no-overlap")) { o->engine.overlap = 0; continue; }
        if (!strcmp(a, "--debug-check")) { o->engine.debug_check = 1; continue; }
        if (!strcmp(a, "--check")) {
            /* The count is optional: a next argument that is a number is the count (0 = off),
             * anything else is the next option. */
            o->check = 4;
            char *end = NULL;
            if (v != NULL)
                (void)strtol(v, &end, 10);
            if (v != NULL && end != v && *end == '\0') {
                if (!parse_int(v, 0, 1 << 20, &n)) {
                    if (g_rank == 0)
                        fprintf(stderr, "gdp-run: --check %s: expected a request count in [0, %d] (0 = no check)\n",
                                v, 1 << 20);
                    return 2;
                }
                o->check = n;
                i++;
            }
            continue;
        }
        if (g_rank == 0)
            fprintf(stderr, "gdp-run: unknown argument '%s' (try --help)\n", a);
        return 2;
#undef CHOICE_OPT
#undef INT_OPT
#undef NEED_VALUE
    }
    return 0;
}

/* The embedded default model: written by one rank per node into a temporary directory. */
static void write_default_model(const options *o, char *path, size_t n, char *dir, size_t dn) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    int ok = 1;
    char msg[1024] = "";
    if (local == 0) {
        const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(dir, dn, "%s/gdp-run-XXXXXX", tmp);
        if (mkdtemp(dir) == NULL) {
            ok = 0;
            snprintf(msg, sizeof msg, "cannot create a temporary directory under %s: %s (set TMPDIR)", tmp,
                     strerror(errno));
        } else {
            snprintf(path, n, "%s/default-model.safetensors", dir);
            gdp_status_t st = gdp_checkpoint_write_synthetic(path, &o->cfg, o->model_seed, GDP_DTYPE_FP32);
            if (st != GDP_STATUS_SUCCESS) {
                ok = 0;
                snprintf(msg, sizeof msg, "writing the default model: %s", gdp_last_error());
            }
        }
    }
    MPI_Bcast(path, (int)n, MPI_CHAR, 0, node);
    MPI_Bcast(dir, (int)dn, MPI_CHAR, 0, node);
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Comm_free(&node);
    if (!all) {
        if (!ok)
            fprintf(stderr, "gdp-run: rank %d: %s\n", g_rank, msg);
        MPI_Finalize();
        exit(1);
    }
}

/* Everything one backend needs; torn down to retry another. */
typedef struct stack {
    gdp_backend_t backend;
    gdp_comm_t    comm;    /* every rank: the engine's */
    gdp_comm_t    tp_comm, cp_comm; /* --cp > 1: this rank's TP group (NULL for tp = 1) and CP group */
    MPI_Comm      tp_mpi, cp_mpi;
    gdp_ctx_t     ctx;
    gdp_model_t   model;
    void         *stream; /* cudaStream_t of the ctx (CUDA): graphs cannot capture the legacy default stream */
} stack;

static void stack_free(stack *s) {
    gdp_model_free(s->model);
    gdp_ctx_free(s->ctx);
#ifdef GDP_HAVE_CUDA
    if (s->stream != NULL)
        cudaStreamDestroy((cudaStream_t)s->stream);
#endif
    gdp_comm_free(s->cp_comm);
    gdp_comm_free(s->tp_comm);
    if (s->tp_mpi != MPI_COMM_NULL)
        MPI_Comm_free(&s->tp_mpi);
    if (s->cp_mpi != MPI_COMM_NULL)
        MPI_Comm_free(&s->cp_mpi);
    gdp_comm_free(s->comm);
    memset(s, 0, sizeof *s);
    s->tp_mpi = s->cp_mpi = MPI_COMM_NULL;
}

/* Comm, ctx and model on `backend`; every rank returns the same status. */
static gdp_status_t stack_init(stack *s, gdp_backend_t backend, gdp_checkpoint_t ckpt, int32_t cp) {
    memset(s, 0, sizeof *s);
    s->tp_mpi = s->cp_mpi = MPI_COMM_NULL;
    s->backend = backend;
    const bool cuda = backend == GDP_BACKEND_CUDA;
    /* With CP the TP and CP groups are comms over MPI sub-communicators, on which
     * gdp_comm_init binds GPUs by the sub-communicator's node-local rank, not this rank's:
     * NCCL there would put ranks on each other's GPUs, so CP runs over the host-staged MPI
     * comm (which works whatever GPU a comm bound; the ctx takes the job comm's). */
    const gdp_comm_backend_t cb =
        cuda && cp == 1 && gdp_comm_backend_available(GDP_COMM_NCCL) ? GDP_COMM_NCCL : GDP_COMM_MPI;
    const gdp_comm_buffers_t where = cuda ? GDP_COMM_DEVICE_BUFFERS : GDP_COMM_HOST_BUFFERS;
    gdp_comm_backend_t used = cb;
    gdp_status_t st = gdp_comm_init(&s->comm, cb, NULL, where);
    if (st != GDP_STATUS_SUCCESS && cb == GDP_COMM_NCCL) { /* more ranks than GPUs: host-staged MPI */
        used = GDP_COMM_MPI;
        st = gdp_comm_init(&s->comm, GDP_COMM_MPI, NULL, where);
    }
    if (st != GDP_STATUS_SUCCESS)
        return st; /* agreed by gdp_comm_init */
    int32_t device = 0;
    if (cuda)
        gdp_comm_device(s->comm, &device);
    if (cp > 1) { /* rank = tp_rank + tp * cp_rank (gdp_parallel_ranks) */
        int32_t tp_rank = 0, cp_rank = 0, cp_size = 1;
        st = gdp_parallel_ranks(g_rank, g_size, g_size / cp, &tp_rank, &cp_rank, &cp_size);
        if (st == GDP_STATUS_SUCCESS) {
            MPI_Comm_split(MPI_COMM_WORLD, cp_rank, tp_rank, &s->tp_mpi);
            MPI_Comm_split(MPI_COMM_WORLD, tp_rank, cp_rank, &s->cp_mpi);
            if (g_size / cp > 1)
                st = gdp_comm_init(&s->tp_comm, used, &s->tp_mpi, where);
            if (st == GDP_STATUS_SUCCESS)
                st = gdp_comm_init(&s->cp_comm, used, &s->cp_mpi, where);
        }
        st = gdp_comm_agree(s->comm, st); /* a failure in one group fails every rank */
        if (st != GDP_STATUS_SUCCESS) {
            stack_free(s);
            return st;
        }
    }
    st = gdp_ctx_init(&s->ctx, backend, device);
#ifdef GDP_HAVE_CUDA
    if (st == GDP_STATUS_SUCCESS && cuda) {
        cudaStream_t stream = NULL;
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess) {
            s->stream = stream;
            st = gdp_ctx_set_stream(s->ctx, stream);
        } /* else: the default stream; the engine then runs without graphs */
    }
#endif
    st = gdp_comm_agree(s->comm, st);
    if (st == GDP_STATUS_SUCCESS)
        st = cp > 1 ? gdp_model_init_cp(&s->model, s->ctx, s->tp_comm, s->cp_comm, ckpt) /* agreed inside */
                    : gdp_model_init(&s->model, s->ctx, s->comm, ckpt);
    if (cp > 1)
        st = gdp_comm_agree(s->comm, st); /* the TP groups and CP groups agreed: now the job */
    if (st != GDP_STATUS_SUCCESS)
        stack_free(s); /* frees only what was made; gdp_last_error() keeps the failure */
    return st;
}

int main(int argc, char **argv) {
    g_main_thread = pthread_self();
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    options o;
    memset(&o, 0, sizeof o);
    gdp_layer_config_default(&o.cfg);
    o.cfg.hidden_size = 256, o.cfg.num_layers = 2, o.cfg.num_heads = 8, o.cfg.num_groups = 2;
    o.cfg.head_dim = 32, o.cfg.state_dim = 64, o.cfg.num_householder = 2, o.cfg.vocab_size = 512;
    o.model_seed = 1234, o.prompt_seed = 1;
    o.backend = "auto";
    o.watchdog = -1;
    gdp_engine_config_default(&o.engine);
    o.limits = gdp_workload_limits_default();
    o.defaults = gdp_request_defaults_default();
    const int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        MPI_Finalize();
        return rc == 1 ? 0 : rc;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    gdp_set_abort_callback(on_abort, NULL);
    if (o.watchdog >= 0)
        gdp_watchdog_set_timeout(o.watchdog);

    /* Every output path is checked before any work (rank 0 writes them all). */
    {
        char why[1200] = "";
        int ok = 1;
        if (g_rank == 0 && o.write_model != NULL)
            ok = check_output_path(o.write_model, why, sizeof why);
        if (g_rank == 0 && ok && o.write_model == NULL && o.output != NULL)
            ok = results_open(o.output, why, sizeof why);
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (!ok) {
            if (g_rank == 0)
                fprintf(stderr, "gdp-run: %s\n", why);
            MPI_Finalize();
            return 1;
        }
    }
    if (o.write_model != NULL) {
        int ok = 1;
        g_phase = "writing the model";
        if (g_rank == 0 && gdp_checkpoint_write_synthetic(o.write_model, &o.cfg, o.model_seed, GDP_DTYPE_FP32)) {
            fprintf(stderr, "gdp-run: %s\n", gdp_last_error());
            ok = 0;
        } else if (g_rank == 0) {
            printf("wrote %s (D=%lld L=%d H=%lld G=%lld P=%lld N=%lld M=%d vocab=%lld, seed %llu)\n", o.write_model,
                   (long long)o.cfg.hidden_size, o.cfg.num_layers, (long long)o.cfg.num_heads,
                   (long long)o.cfg.num_groups, (long long)o.cfg.head_dim, (long long)o.cfg.state_dim,
                   o.cfg.num_householder, (long long)o.cfg.vocab_size, (unsigned long long)o.model_seed);
        }
        MPI_Finalize();
        return ok ? 0 : 1;
    }
    if (strcmp(o.backend, "auto") && strcmp(o.backend, "cpu") && strcmp(o.backend, "cuda")) {
        if (g_rank == 0)
            fprintf(stderr, "gdp-run: --backend %s: use auto, cpu or cuda\n", o.backend);
        MPI_Finalize();
        return 2;
    }
    o.engine.check_requests = o.check;
    if (o.cp < 1)
        o.cp = 1;
    if (g_size % o.cp != 0) {
        if (g_rank == 0)
            fprintf(stderr, "gdp-run: --cp %d does not divide the %d ranks (tp = ranks / cp)\n", o.cp, g_size);
        MPI_Finalize();
        return 2;
    }
    const int32_t tp = g_size / o.cp;

    /* The embedded default shards its heads and groups over every TP rank (tp = the ranks
     * / cp): raise G (and H with it) to the TP size where G = 2 would not divide. */
    if (o.model == NULL && !o.groups_set && o.cfg.num_groups % tp != 0) {
        const int64_t g0 = o.cfg.num_groups, h0 = o.cfg.num_heads;
        while (o.cfg.num_groups % tp != 0)
            o.cfg.num_groups += g0;
        if (!o.heads_set)
            while (o.cfg.num_heads % o.cfg.num_groups != 0 || o.cfg.num_heads < o.cfg.num_groups)
                o.cfg.num_heads += h0;
        if (g_rank == 0)
            printf("# default model: G raised from %lld to %lld%s so that tp %d divides the groups\n", (long long)g0,
                   (long long)o.cfg.num_groups, o.cfg.num_heads != h0 ? " (and H with it)" : "", tp);
    }

    /* The model: --model, or the embedded default. */
    g_phase = "loading the model";
    char path[1024] = "", dir[1024] = "";
    if (o.model != NULL)
        snprintf(path, sizeof path, "%s", o.model);
    else
        write_default_model(&o, path, sizeof path, dir, sizeof dir);
    gdp_checkpoint_t ckpt = NULL;
    gdp_status_t st = gdp_checkpoint_open(&ckpt, path);
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_checkpoint_set_finite_check(ckpt, !o.no_finite_check);
    int ok = st == GDP_STATUS_SUCCESS, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok)
        fprintf(stderr, "gdp-run: rank %d: %s\n", g_rank, gdp_last_error());
    if (!all) {
        MPI_Finalize();
        return 1;
    }
    gdp_layer_config cfg;
    gdp_checkpoint_get_config(ckpt, &cfg);

    /* The backend: CUDA where it runs, else the CPU. */
    stack s;
    const bool want_cuda = !strcmp(o.backend, "cuda") || (!strcmp(o.backend, "auto") &&
                                                          gdp_backend_available(GDP_BACKEND_CUDA));
    st = GDP_STATUS_UNSUPPORTED;
    if (want_cuda) {
        st = stack_init(&s, GDP_BACKEND_CUDA, ckpt, o.cp);
        if (st != GDP_STATUS_SUCCESS && !strcmp(o.backend, "cuda"))
            exit_if_failed(st, "setting up the CUDA backend (--backend cuda)");
        if (st != GDP_STATUS_SUCCESS && g_rank == 0)
            fprintf(stderr, "gdp-run: warning: the CUDA backend did not start (%s); running on the CPU backend\n",
                    gdp_last_error());
    }
    if (st != GDP_STATUS_SUCCESS)
        exit_if_failed(stack_init(&s, GDP_BACKEND_CPU, ckpt, o.cp), "setting up the CPU backend");
    gdp_checkpoint_free(ckpt);
    g_job_comm = s.comm;

    /* The workload, on the root. */
    gdp_workload wl;
    memset(&wl, 0, sizeof wl);
    st = GDP_STATUS_SUCCESS;
    if (!o.engine.honor_arrivals)
        o.limits.max_arrival_s = DBL_MAX; /* arrival times are ignored: no horizon to keep */
    if (g_rank == 0) {
        if (o.workload == NULL || !strncmp(o.workload, "synthetic", 9)) {
            gdp_synthetic_workload sp;
            gdp_workload_synthetic_default(&sp);
            if (o.workload != NULL)
                st = gdp_workload_parse_synthetic(o.workload, &sp);
            if (st == GDP_STATUS_SUCCESS)
                st = gdp_workload_synthetic_ex(&wl, &sp, cfg.vocab_size, &o.limits, &o.defaults);
        } else {
            st = gdp_workload_load_jsonl_ex(&wl, o.workload, cfg.vocab_size, o.prompt_seed, &o.limits, &o.defaults);
        }
    }
    if (g_rank == 0 && st == GDP_STATUS_SUCCESS) {
        g_total = wl.n_requests;
        g_out.n = wl.n_requests;
        g_out.written = calloc((size_t)wl.n_requests + 1, 1); /* which lines --output holds */
        if (g_out.written == NULL)
            st = GDP_STATUS_SYSTEM_ERROR;
    }
    exit_if_failed(gdp_comm_agree(s.comm, st), "loading the workload");

    g_phase = "setting up the engine";
    o.engine.on_result = g_rank == 0 ? on_result : NULL;
    gdp_engine_t engine = NULL;
    exit_if_failed(gdp_engine_init(&engine, s.ctx, s.comm, s.model, &o.engine), "gdp_engine_init");
    const char *comm_name = "";
    gdp_comm_name(s.comm, &comm_name);
    char title[1024];
    snprintf(title, sizeof title,
             "#   model    : D=%lld L=%d H=%lld G=%lld P=%lld N=%lld M=%d vocab=%lld  (%s)\n"
             "#   ranks    : tp %d x cp %d, backend %s, comm %s\n"
             "#   workload : %s, %d requests\n",
             (long long)cfg.hidden_size, cfg.num_layers, (long long)cfg.num_heads, (long long)cfg.num_groups,
             (long long)cfg.head_dim, (long long)cfg.state_dim, cfg.num_householder, (long long)cfg.vocab_size,
             o.model ? o.model : "embedded default, synthetic weights", tp, o.cp,
             s.backend == GDP_BACKEND_CUDA ? "cuda" : "cpu", comm_name, g_rank == 0 ? wl.source : "",
             wl.n_requests);
    if (g_rank == 0) {
        int version = 0;
        gdp_get_version(&version);
        printf("# gdp %d.%d.%d  gdp-run\n%s", version / 10000, version / 100 % 100, version % 100, title);
        fflush(stdout);
    }

    g_phase = "serving the workload";
    exit_if_failed(gdp_engine_run(engine, g_rank == 0 ? &wl : NULL), "gdp_engine_run");
    g_phase = "reporting";
    int status = 0;
    if (g_out.fd >= 0) {
        /* Requests the engine did not hand to on_result (none, once it calls it for every
         * request) are written now, in workload order. */
        for (int32_t i = 0; i < g_out.n; i++) {
            gdp_request_result r;
            if (!g_out.written[i] && gdp_engine_get_result(engine, i, &r) == GDP_STATUS_SUCCESS) {
                r.index = i;
                results_write(&r);
            }
        }
        status = results_close() ? 0 : 1;
    }
    exit_if_failed(gdp_engine_print_report(engine, stdout, title), "gdp_engine_print_report");
    if (o.output != NULL && g_rank == 0 && status == 0)
        printf("generated tokens written to %s (%d requests)\n", o.output, (int)g_lines);
    if (o.check > 0) {
        g_phase = "checking";
        double worst = 0;
        int32_t checked = 0, mismatches = 0;
        exit_if_failed(gdp_engine_check(engine, &worst, &checked, &mismatches), "gdp_engine_check");
        const double bar = s.backend == GDP_BACKEND_CPU ? 1e-4 : 5e-2;
        const bool pass = worst <= bar && mismatches == 0;
        if (g_rank == 0)
            printf("check: decode vs recomputing the sequence, %d requests: worst max|a-b|/max|b| of the last logits "
                   "%.2e (bar %.0e), greedy tokens differing above the margin bar: %d  %s\n",
                   checked, worst, bar, mismatches, pass ? "OK" : "MISMATCH");
        int bad = g_rank == 0 && !pass;
        MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
        status = status || bad;
    }

    g_phase = "shutting down";
    gdp_engine_free(engine);
    gdp_workload_free(&wl);
    free(g_out.written);
    g_job_comm = NULL;
    stack_free(&s);
    if (dir[0] != '\0') {
        MPI_Barrier(MPI_COMM_WORLD);
        remove(path); /* each node's writer cleans its copy; the others find it gone */
        rmdir(dir);
    }
    MPI_Finalize();
    return status;
}
