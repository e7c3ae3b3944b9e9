/*
 * watchdog.c: the comm watchdog of comm.h. Every wait of a comm for its peers (the MPI
 * backend's collectives, agreements, host broadcasts, barriers, device-stream waits) is a
 * poll with a deadline instead of a blocking call:
 *   - the poll spins for 50 us, then yields the CPU between polls (sched_yield, so
 *     oversubscribed ranks let their peers run) up to 2 ms, then sleeps in steps growing
 *     from 20 us to 1 ms: a rank waiting for a stalled peer uses next to no CPU, and a
 *     short wait costs a few MPI_Test calls more than a blocking call;
 *   - an MPI wait moves its data only inside MPI calls (Open MPI progresses a large message
 *     fragment by fragment, 32 KB each over shared memory without a single-copy mechanism),
 *     so it yields instead of sleeping for as long as its bytes could still be moving at
 *     250 MB/s: sleeping from 2 ms on, an 8 MB allreduce of two ranks took 88-99 ms instead
 *     of 2 ms (85 MB/s; kernels/NOTES-ops.md, thirty-first session). The MPI comm starts a
 *     large collective only once every rank is there (comm.c, gdp_comm_await_peers), so that
 *     window opens with the data ready to move;
 *   - every 20 ms of a long wait it answers the probes other ranks sent it;
 *   - past the step timeout it probes every rank of the comm (a small message on a
 *     private duplicate of the communicator, answered by any rank inside a gdp wait or
 *     gdp_comm_sleep) and names the ranks that do not answer within the grace time.
 * Once it fires, every later comm call of the process fails at once (gdp_watch_check),
 * so error paths do not wait again; the program ends the job (gdp_fatal, MPI_Abort).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_internal.h"

enum { TAG_PROBE = 7101, TAG_ANSWER = 7102 };
/* What this process is doing, as it answers a probe. */
enum { IN_NOTHING = 0, IN_WAIT, IN_SLEEP, IN_STREAM };

static const double busy_s = 50e-6;    /* pure polling: a short wait costs no system call */
static const double spin_s = 2e-3;     /* polling with sched_yield before the first sleep */
static const double first_nap_s = 20e-6, max_nap_s = 1e-3;
static const double service_s = 0.02;  /* answer probes this often while waiting */
static const double mpi_drive_Bps = 250e6; /* an MPI wait yields (no sleep) while its bytes could move at this rate */
static const double mpi_drive_max_s = 1.0;

static struct {
    double           timeout_s; /* < 0: not read yet (GDP_WATCHDOG_TIMEOUT, else the default) */
    int64_t          step;      /* gdp_watchdog_set_step; -1: never set */
    int              fired;
    char             message[1400];
    struct gdp_comm *live;      /* comms whose probes this process answers */
    uint32_t         rounds;
    /* the wait in progress (one at a time: a process waits on one thing) */
    int              kind;
    const char      *what;
    int64_t          op;
    double           since;
} g = {.timeout_s = -1, .step = -1};

typedef struct probe {
    uint32_t round;
} probe;

typedef struct answer {
    uint32_t round;
    int32_t  kind;
    int64_t  step, op;
    double   waited_s;
    char     what[48];
} answer;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- configuration ----------------------------------------------------------------- */
gdp_status_t gdp_watch_config(void) {
    if (g.timeout_s >= 0)
        return GDP_STATUS_SUCCESS;
    const char *env = getenv("GDP_WATCHDOG_TIMEOUT");
    if (env == NULL || env[0] == '\0') {
        g.timeout_s = GDP_WATCHDOG_DEFAULT_TIMEOUT_S;
        return GDP_STATUS_SUCCESS;
    }
    char *end = NULL;
    errno = 0;
    const double v = strtod(env, &end);
    if (errno || end == env || *end != '\0' || !(v >= 0) || v > 1e9) {
        g.timeout_s = GDP_WATCHDOG_DEFAULT_TIMEOUT_S;
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "GDP_WATCHDOG_TIMEOUT=%s is not a number of seconds in [0, 1e9] (0 turns the watchdog off; "
                 "unset it for the default %g s)", env, GDP_WATCHDOG_DEFAULT_TIMEOUT_S);
    }
    g.timeout_s = v;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_watchdog_set_timeout(double seconds) {
    if (!(seconds >= 0) || seconds > 1e9)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_watchdog_set_timeout: %g s is not in [0, 1e9] (0 turns it off)",
                 seconds);
    g.timeout_s = seconds;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_watchdog_get_timeout(double *seconds) {
    if (seconds == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_watchdog_get_timeout: seconds is NULL");
    gdp_status_t st = gdp_watch_config();
    *seconds = g.timeout_s;
    return st;
}

gdp_status_t gdp_watchdog_set_step(int64_t step) {
    g.step = step;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_watchdog_get_step(int64_t *step) {
    if (step == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_watchdog_get_step: step is NULL");
    *step = g.step;
    return GDP_STATUS_SUCCESS;
}

int gdp_watchdog_fired(void) { return g.fired; }

gdp_status_t gdp_watch_check(const char *fn) {
    if (g.fired)
        GDP_FAIL(GDP_STATUS_REMOTE_ERROR, "%s: not started, the watchdog ended this job's communication: %s", fn,
                 g.message);
    return GDP_STATUS_SUCCESS;
}

/* ---- the comms a process answers for -------------------------------------------------- */
gdp_status_t gdp_watch_join(struct gdp_comm *c) {
    c->watch = MPI_COMM_NULL;
    c->peers = NULL;
    GDP_MPI_CHECK(MPI_Comm_dup(c->mpi, &c->watch));
    c->next_watched = g.live;
    g.live = c;
    struct gdp_peer me;
    memset(&me, 0, sizeof me);
    me.world_rank = c->world_rank;
    me.pid = (int32_t)getpid();
    if (gethostname(me.host, sizeof me.host - 1) != 0)
        snprintf(me.host, sizeof me.host, "?");
    /* A failed calloc still joins the gather (into a stack copy) so the peers do not hang. */
    struct gdp_peer *all = gdp_calloc((size_t)c->size, sizeof *all, "the comm's peer table");
    struct gdp_peer one;
    int err = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all ? (void *)all : (void *)&one,
                            all ? (int)sizeof me : 0, MPI_BYTE, c->mpi);
    if (err != MPI_SUCCESS || all == NULL) {
        free(all);
        if (err != MPI_SUCCESS)
            return gdp_mpi_fail(err, "MPI_Allgather(peer table)", __FILE__, __LINE__);
        return GDP_STATUS_SYSTEM_ERROR;
    }
    c->peers = all;
    return GDP_STATUS_SUCCESS;
}

void gdp_watch_leave(struct gdp_comm *c) {
    for (struct gdp_comm **p = &g.live; *p != NULL; p = &(*p)->next_watched)
        if (*p == c) {
            *p = c->next_watched;
            break;
        }
    c->next_watched = NULL;
    if (c->watch != MPI_COMM_NULL)
        MPI_Comm_free(&c->watch);
    free(c->peers);
    c->peers = NULL;
}

static answer current_answer(uint32_t round) {
    answer a;
    memset(&a, 0, sizeof a);
    a.round = round;
    a.kind = g.kind;
    a.step = g.step;
    a.op = g.op;
    a.waited_s = g.kind != IN_NOTHING ? now_s() - g.since : 0;
    snprintf(a.what, sizeof a.what, "%s", g.what ? g.what : "");
    return a;
}

/* Answers every probe that reached this process on any live comm. */
static void watch_service(void) {
    for (struct gdp_comm *c = g.live; c != NULL; c = c->next_watched) {
        if (c->watch == MPI_COMM_NULL)
            continue;
        for (;;) {
            int flag = 0;
            MPI_Status s;
            if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_PROBE, c->watch, &flag, &s) != MPI_SUCCESS || !flag)
                break;
            probe p;
            if (MPI_Recv(&p, (int)sizeof p, MPI_BYTE, s.MPI_SOURCE, TAG_PROBE, c->watch, MPI_STATUS_IGNORE) !=
                MPI_SUCCESS)
                break;
            answer a = current_answer(p.round);
            /* a few dozen bytes: sent eagerly, so this never waits for the prober */
            MPI_Send(&a, (int)sizeof a, MPI_BYTE, s.MPI_SOURCE, TAG_ANSWER, c->watch);
        }
    }
}

/* ---- the wait ------------------------------------------------------------------------ */
/* 1: done, 0: pending, -1: failed (message recorded). */
typedef int (*poll_fn)(void *arg);

typedef struct mpi_poll {
    MPI_Request *req;
    const char  *what;
} mpi_poll;

static int poll_mpi(void *arg) {
    mpi_poll *p = arg;
    int done = 0;
    int err = MPI_Test(p->req, &done, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) {
        gdp_mpi_fail(err, p->what, __FILE__, __LINE__);
        return -1;
    }
    return done;
}

typedef enum verdict {
    V_DONE,        /* the operation completed during the probe */
    V_STALLED,     /* some rank did not answer */
    V_ALIVE,       /* every rank answered and one is idle (gdp_comm_sleep): keep waiting */
    V_ALL_WAITING, /* every rank answered, all inside waits */
    V_FAILED       /* the poll itself failed */
} verdict;

static const char *kind_name(int kind) {
    switch (kind) {
    case IN_WAIT: return "waits";
    case IN_SLEEP: return "is idle (gdp_comm_sleep)";
    case IN_STREAM: return "waits for its GPU stream";
    default: return "is outside gdp's waits";
    }
}

static double grace_s(void) {
    const double q = g.timeout_s / 4;
    return q < 0.5 ? 0.5 : q > 5 ? 5 : q;
}

/* Probes every other rank of c; ans/got[r] hold the answers. */
static verdict probe_ranks(struct gdp_comm *c, poll_fn poll, void *arg, answer *ans, char *got) {
    const uint32_t round = ((uint32_t)c->world_rank << 20) ^ ++g.rounds;
    ans[c->rank] = current_answer(round);
    got[c->rank] = 1;
    if (c->watch == MPI_COMM_NULL)
        return V_STALLED;
    /* The probe buffer and requests outlive this call when a send to a stopped rank is still
     * pending (they are then left to MPI, never freed: a few bytes per firing). */
    probe *p = malloc(sizeof *p);
    MPI_Request *sends = calloc((size_t)c->size, sizeof *sends);
    if (p == NULL || sends == NULL) {
        free(p);
        free(sends);
        return V_STALLED;
    }
    p->round = round;
    for (int32_t r = 0; r < c->size; r++) {
        sends[r] = MPI_REQUEST_NULL;
        if (r != c->rank)
            MPI_Isend(p, (int)sizeof *p, MPI_BYTE, r, TAG_PROBE, c->watch, &sends[r]);
    }
    int32_t have = 1;
    verdict v = V_STALLED;
    const double deadline = now_s() + grace_s();
    while (have < c->size && now_s() < deadline) {
        const int done = poll(arg);
        if (done != 0) {
            v = done > 0 ? V_DONE : V_FAILED;
            break;
        }
        for (;;) {
            int flag = 0;
            MPI_Status s;
            if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_ANSWER, c->watch, &flag, &s) != MPI_SUCCESS || !flag)
                break;
            answer a;
            if (MPI_Recv(&a, (int)sizeof a, MPI_BYTE, s.MPI_SOURCE, TAG_ANSWER, c->watch, MPI_STATUS_IGNORE) !=
                MPI_SUCCESS)
                break;
            if (a.round == round && s.MPI_SOURCE >= 0 && s.MPI_SOURCE < c->size && !got[s.MPI_SOURCE]) {
                a.what[sizeof a.what - 1] = '\0';
                ans[s.MPI_SOURCE] = a;
                got[s.MPI_SOURCE] = 1;
                have++;
            } /* else: an answer to an earlier probe */
        }
        watch_service();
        nap(1e-3);
    }
    int pending = 0;
    for (int32_t r = 0; r < c->size; r++) {
        int done = 1;
        if (sends[r] != MPI_REQUEST_NULL)
            MPI_Test(&sends[r], &done, MPI_STATUS_IGNORE);
        if (!done) {
            MPI_Request_free(&sends[r]);
            pending = 1;
        }
    }
    free(sends);
    if (!pending)
        free(p);
    if (v == V_DONE || v == V_FAILED || have < c->size)
        return v;
    for (int32_t r = 0; r < c->size; r++)
        if (ans[r].kind == IN_SLEEP || ans[r].kind == IN_NOTHING)
            return V_ALIVE;
    return V_ALL_WAITING;
}

static int append(char *buf, size_t n, size_t *used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int append(char *buf, size_t n, size_t *used, const char *fmt, ...) {
    if (*used >= n)
        return 0;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *used, n - *used, fmt, ap);
    va_end(ap);
    if (k > 0)
        *used = *used + (size_t)k < n ? *used + (size_t)k : n;
    return k;
}

static void describe_rank(char *buf, size_t n, size_t *used, const struct gdp_comm *c, int32_t r) {
    if (c->peers != NULL)
        append(buf, n, used, "rank %d (world rank %d, host %s, pid %d)", r, c->peers[r].world_rank,
               c->peers[r].host, c->peers[r].pid);
    else
        append(buf, n, used, "rank %d", r);
}

static void describe_wait(char *buf, size_t n, size_t *used, int64_t step, const char *what, int64_t op) {
    if (step >= 0)
        append(buf, n, used, "at step %lld ", (long long)step);
    append(buf, n, used, "in %s (operation %lld of the comm)", what && what[0] ? what : "?", (long long)op);
}

/* The message of a firing: who waited where, who did not answer, what the others do. */
static void compose(struct gdp_comm *c, const char *what, double waited, verdict v, const answer *ans,
                    const char *got) {
    char *m = g.message;
    const size_t n = sizeof g.message;
    size_t used = 0;
    append(m, n, &used, "watchdog: ");
    describe_rank(m, n, &used, c, c->rank);
    append(m, n, &used, " of %d waited %.1f s ", c->size, waited);
    describe_wait(m, n, &used, g.step, what, c->ops);
    int32_t missing = 0;
    for (int32_t r = 0; r < c->size; r++)
        missing += !got[r];
    if (v == V_STALLED && c->watch == MPI_COMM_NULL) {
        append(m, n, &used, ", and cannot tell which of the %d ranks is stalled (no probe channel)", c->size);
    } else if (v == V_STALLED) {
        append(m, n, &used, " for ");
        int32_t shown = 0;
        for (int32_t r = 0; r < c->size; r++)
            if (!got[r] && shown++ < 4) {
                append(m, n, &used, "%s", shown > 1 ? ", " : "");
                describe_rank(m, n, &used, c, r);
            }
        if (missing > 4)
            append(m, n, &used, " and %d more", missing - 4);
        append(m, n, &used,
               ", which %s not answer within %.1f s: stopped, hung, or busy outside gdp's waits for longer than the "
               "step timeout of %g s (GDP_WATCHDOG_TIMEOUT; gdp-run --watchdog)",
               missing > 1 ? "do" : "does", grace_s(), g.timeout_s);
    } else {
        append(m, n, &used,
               ": every rank answers but the operation does not complete after twice the step timeout of %g s "
               "(ranks in different operations are a mismatch of collectives; all waiting for GPU streams is a "
               "hung GPU or NCCL)", g.timeout_s);
    }
    int32_t listed = 0;
    for (int32_t r = 0; r < c->size && listed < 6; r++) {
        if (r == c->rank || !got[r])
            continue;
        append(m, n, &used, "%s rank %d %s ", listed++ ? "," : ";", r, kind_name(ans[r].kind));
        describe_wait(m, n, &used, ans[r].step, ans[r].what, ans[r].op);
    }
}

/* Polls until done: busy for busy_s, yielding until yield_s, then sleeping up to max_nap_s between polls. */
static gdp_status_t bounded_wait(struct gdp_comm *c, poll_fn poll, void *arg, int kind, const char *what,
                                 double yield_s) {
    GDP_CHECK(gdp_watch_config());
    const int saved_kind = g.kind;
    const char *saved_what = g.what;
    const int64_t saved_op = g.op;
    const double saved_since = g.since;
    const double t0 = now_s();
    g.kind = kind, g.what = what, g.op = c->ops, g.since = t0;
    const double timeout = g.timeout_s;
    double deadline = timeout > 0 ? t0 + timeout : 0, next_service = t0 + service_s, nap_s = 0;
    int extended = 0;
    gdp_status_t st = GDP_STATUS_SUCCESS;
    for (;;) {
        const int done = poll(arg);
        if (done != 0) {
            st = done > 0 ? GDP_STATUS_SUCCESS : GDP_STATUS_MPI_ERROR;
            break;
        }
        const double t = now_s();
        if (t - t0 < busy_s) {
            /* poll again at once */
        } else if (t - t0 < yield_s) {
            sched_yield();
        } else {
            nap_s = nap_s == 0 ? first_nap_s : nap_s * 2 > max_nap_s ? max_nap_s : nap_s * 2;
            nap(nap_s);
        }
        if (t >= next_service) {
            watch_service();
            next_service = t + service_s;
        }
        if (timeout > 0 && t >= deadline) {
            answer *ans = calloc((size_t)c->size, sizeof *ans);
            char *got = calloc((size_t)c->size, 1);
            verdict v = ans && got ? probe_ranks(c, poll, arg, ans, got) : V_STALLED;
            if (v == V_DONE || v == V_FAILED) {
                free(ans);
                free(got);
                st = v == V_DONE ? GDP_STATUS_SUCCESS : GDP_STATUS_MPI_ERROR;
                break;
            }
            if (v == V_ALIVE || (v == V_ALL_WAITING && !extended++)) {
                free(ans);
                free(got);
                deadline = now_s() + timeout;
                continue;
            }
            if (ans && got)
                compose(c, what, now_s() - t0, v, ans, got);
            else
                snprintf(g.message, sizeof g.message, "watchdog: rank %d waited %.1f s in %s (out of memory naming "
                         "the stalled rank)", c->rank, now_s() - t0, what);
            free(ans);
            free(got);
            g.fired = 1;
            st = GDP_ERROR(GDP_STATUS_REMOTE_ERROR, "%s", g.message);
            break;
        }
    }
    g.kind = saved_kind, g.what = saved_what, g.op = saved_op, g.since = saved_since;
    return st;
}

gdp_status_t gdp_watch_wait(struct gdp_comm *c, MPI_Request *req, size_t bytes, const char *what) {
    c->ops++; /* every rank counts the same waits, so the number names one operation */
    int done = 0;
    int err = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS)
        return gdp_mpi_fail(err, what, __FILE__, __LINE__);
    if (done)
        return GDP_STATUS_SUCCESS;
    mpi_poll p = {.req = req, .what = what};
    const double drive_s = spin_s + (double)bytes / mpi_drive_Bps;
    return bounded_wait(c, poll_mpi, &p, IN_WAIT, what, drive_s < mpi_drive_max_s ? drive_s : mpi_drive_max_s);
}

#ifdef GDP_HAVE_CUDA
static int poll_stream(void *arg) {
    cudaError_t e = cudaStreamQuery((cudaStream_t)arg);
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady)
        return 0;
    gdp_cuda_error(e, __FILE__, __LINE__, "%s: cudaStreamQuery failed", __func__);
    return -1;
}

static int poll_event(void *arg) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)arg);
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady)
        return 0;
    gdp_cuda_error(e, __FILE__, __LINE__, "%s: cudaEventQuery failed", __func__);
    return -1;
}

/* A bounded wait for a stream (event NULL) or for one event recorded on it. */
static gdp_status_t watch_device(struct gdp_comm *c, void *stream, void *event, const char *what) {
    c->ops++;
    poll_fn poll = event != NULL ? poll_event : poll_stream;
    void *arg = event != NULL ? event : stream;
    const int done = poll(arg);
    if (done != 0)
        return done > 0 ? GDP_STATUS_SUCCESS : GDP_STATUS_CUDA_ERROR;
    gdp_status_t st = bounded_wait(c, poll, arg, IN_STREAM, what, spin_s); /* the GPU needs no calls */
    if (st == GDP_STATUS_MPI_ERROR)
        st = GDP_STATUS_CUDA_ERROR; /* the poll that failed was cudaStreamQuery */
    if (st == GDP_STATUS_REMOTE_ERROR && !c->aborted) {
        /* NCCL kernels waiting for the stalled peer never end by themselves */
        c->aborted = 1;
        (void)c->iface.abort(c);
    }
    return st;
}

gdp_status_t gdp_watch_stream(struct gdp_comm *c, void *stream, const char *what) {
    return watch_device(c, stream, NULL, what);
}
#endif

/* ---- public -------------------------------------------------------------------------- */
static gdp_status_t check_comm(gdp_comm_t comm, const char *fn) {
    if (comm == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: comm is NULL; create one with gdp_comm_init()", fn);
    if (comm->magic != GDP_COMM_MAGIC || comm->magic_end != GDP_COMM_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: comm %p is not a live gdp comm (freed or corrupted)", fn,
                 (void *)comm);
    return gdp_watch_check(fn);
}

gdp_status_t gdp_comm_sleep(gdp_comm_t comm, double seconds) {
    GDP_CHECK(check_comm(comm, "gdp_comm_sleep"));
    if (!(seconds >= 0))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_comm_sleep: seconds = %g must be >= 0", seconds);
    const int saved_kind = g.kind;
    const char *saved_what = g.what;
    const double saved_since = g.since;
    const double t0 = now_s(), end = t0 + seconds;
    g.kind = IN_SLEEP, g.what = "gdp_comm_sleep", g.since = t0;
    for (double t = t0; t < end; t = now_s()) {
        watch_service();
        nap(end - t < service_s ? end - t : service_s);
    }
    g.kind = saved_kind, g.what = saved_what, g.since = saved_since;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_comm_event_wait(gdp_comm_t comm, void *event) {
    GDP_CHECK(check_comm(comm, "gdp_comm_event_wait"));
    if (event == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_comm_event_wait: event is NULL; pass a cudaEvent_t recorded on a "
                 "stream");
#ifdef GDP_HAVE_CUDA
    return watch_device(comm, NULL, event, "gdp_comm_event_wait");
#else
    return GDP_STATUS_SUCCESS; /* no CUDA in this build: no event can be pending */
#endif
}

gdp_status_t gdp_comm_stream_wait(gdp_comm_t comm, void *stream) {
    GDP_CHECK(check_comm(comm, "gdp_comm_stream_wait"));
#ifdef GDP_HAVE_CUDA
    return gdp_watch_stream(comm, stream, "gdp_comm_stream_wait");
#else
    (void)stream; /* no CUDA in this build: no stream holds work */
    return GDP_STATUS_SUCCESS;
#endif
}
