/*
 * test_watchdog.c: the comm watchdog (comm.h, dist/watchdog.c) under mpirun.
 *
 *   stall N: a loop of steps (gdp_watchdog_set_step, then an agreement, a host broadcast
 *            and an all-reduce, the waits of an engine step); at step 5 rank N stops itself
 *            with SIGSTOP. The others' watchdog must fail a wait within the timeout plus the
 *            grace time, naming rank N and step 5; a later comm call must then fail at once
 *            (no second wait); the ranks end the job with GDP_FATAL (MPI_Abort).
 *            Run by tests/scripts/expect_job_failure.cmake, which checks the exit code, the
 *            time and the message.
 *   idle:    (exit 0) rank 1 sleeps 2.5 timeouts in gdp_comm_sleep, then 0.6 timeouts in a
 *            plain sleep, while rank 0 waits in gdp_comm_agree: an idle peer answers the
 *            probes, so nothing fires; rank 0 uses little CPU meanwhile (it sleeps, not
 *            spins); a bad GDP_WATCHDOG_TIMEOUT fails gdp_comm_init naming it; a normal
 *            agreement stays in the microseconds.
 * Reaching the end of "stall" prints UNEXPECTED (caught by the wrapper).
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "gdp/comm.h"
#include "test_common.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* One engine-like step: every kind of wait the engine does. */
static gdp_status_t step(gdp_comm_t comm, int32_t rank, int64_t s) {
    gdp_status_t st = gdp_comm_agree(comm, GDP_STATUS_SUCCESS);
    int32_t frame[64] = {0};
    if (rank == 0)
        frame[0] = (int32_t)s;
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_comm_host_bcast(comm, frame, sizeof frame, 0);
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = 1.0f;
    if (st == GDP_STATUS_SUCCESS)
        st = gdp_comm_allreduce(comm, x, x, 256, GDP_DTYPE_FP32, NULL);
    return st;
}

static int run_stall(int32_t stopper) {
    gdp_comm_t comm = NULL;
    GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&comm, GDP_COMM_MPI, NULL, GDP_COMM_HOST_BUFFERS));
    int32_t rank = 0, size = 1;
    gdp_comm_rank(comm, &rank);
    gdp_comm_size(comm, &size);
    if (stopper < 0 || stopper >= size)
        GDP_FATAL(comm, "stall: rank %d is not in [0, %d)", stopper, size);
    for (int64_t s = 1; s <= 1000; s++) {
        gdp_watchdog_set_step(s);
        if (s == 5 && rank == stopper) {
            fprintf(stderr, "rank %d: stopping itself (SIGSTOP) at step %lld\n", rank, (long long)s);
            fflush(stderr);
            raise(SIGSTOP);
        }
        const double t0 = now_s();
        gdp_status_t st = step(comm, rank, s);
        if (st != GDP_STATUS_SUCCESS) {
            char first[2048];
            snprintf(first, sizeof first, "%s", gdp_last_error());
            const double waited = now_s() - t0;
            /* after the firing no comm call may wait again */
            const double t1 = now_s();
            gdp_status_t again = gdp_comm_agree(comm, GDP_STATUS_SUCCESS);
            const double fast = now_s() - t1;
            fprintf(stderr, "rank %d: step %lld failed after %.1f s: %s; fired %d; a later agree returned %s in %.3f s%s\n",
                    rank, (long long)s, waited, first, gdp_watchdog_fired(), gdp_status_string(again), fast,
                    again == GDP_STATUS_REMOTE_ERROR && fast < 0.1 ? " (fail-fast ok)" : " (NOT fail-fast)");
            GDP_FATAL(comm, "rank %d: the watchdog ended step %lld", rank, (long long)s);
        }
        usleep(20000);
    }
    printf("UNEXPECTED: rank %d finished every step although rank %d stopped\n", rank, stopper);
    gdp_comm_free(comm);
    MPI_Finalize();
    return 0;
}

static int run_idle(void) {
    int world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    /* a bad timeout value fails init on every rank, naming the variable */
    setenv("GDP_WATCHDOG_TIMEOUT", "1s", 1);
    gdp_comm_t comm = NULL;
    gdp_status_t st = gdp_comm_init(&comm, GDP_COMM_MPI, NULL, GDP_COMM_HOST_BUFFERS);
    CHECK(st == GDP_STATUS_INVALID_ARGUMENT || st == GDP_STATUS_REMOTE_ERROR, "init with GDP_WATCHDOG_TIMEOUT=1s: %s",
          gdp_status_string(st));
    CHECK(strstr(gdp_last_error(), "GDP_WATCHDOG_TIMEOUT=1s") != NULL, "message: %s", gdp_last_error());
    CHECK(comm == NULL, "comm is %p after a failed init", (void *)comm);
    CHECK_STATUS(gdp_watchdog_set_timeout(-1), GDP_STATUS_INVALID_ARGUMENT);
    const double timeout = 1.0;
    CHECK_OK(gdp_watchdog_set_timeout(timeout));
    double got = 0;
    CHECK_OK(gdp_watchdog_get_timeout(&got));
    CHECK(got == timeout, "timeout %g", got);
    GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&comm, GDP_COMM_MPI, NULL, GDP_COMM_HOST_BUFFERS));
    int32_t rank = 0;
    gdp_comm_rank(comm, &rank);
    gdp_watchdog_set_step(7);

    /* normal agreements: the bounded wait costs next to nothing. The best of 5 batches: a batch
     * during which another process holds the CPU the peer needs (2 cores, an ASan build beside
     * other jobs) measured just over the 2 ms spin window per call once; a wait that naps on
     * every call is slow in every batch. */
    const int n = 400, batches = 5;
    GDP_FATAL_IF_ERROR(comm, gdp_comm_agree(comm, GDP_STATUS_SUCCESS));
    double per = 1e9, t0 = 0;
    for (int bt = 0; bt < batches; bt++) {
        t0 = now_s();
        for (int i = 0; i < n; i++)
            GDP_FATAL_IF_ERROR(comm, gdp_comm_agree(comm, GDP_STATUS_SUCCESS));
        const double batch = (now_s() - t0) / n;
        per = batch < per ? batch : per;
    }
    if (rank == 0)
        printf("gdp_comm_agree: %.1f us per call (best of %d batches of %d calls, 2 ranks)\n", per * 1e6, batches, n);
    CHECK(per < 2e-3, "an agreement takes %.3f ms in the best of %d batches", per * 1e3, batches);

    /* an idle peer (gdp_comm_sleep) longer than the timeout, then a short plain sleep */
    t0 = now_s();
    const double c0 = cpu_s();
    if (rank == 1) {
        CHECK_OK(gdp_comm_sleep(comm, 2.5 * timeout));
        usleep((useconds_t)(0.6 * timeout * 1e6));
    }
    st = gdp_comm_agree(comm, GDP_STATUS_SUCCESS);
    const double wall = now_s() - t0, cpu = cpu_s() - c0;
    CHECK(st == GDP_STATUS_SUCCESS, "rank %d: the agreement after the idle peer: %s: %s", rank, gdp_status_string(st),
          gdp_last_error());
    CHECK(!gdp_watchdog_fired(), "rank %d: the watchdog fired for an idle peer", rank);
    if (rank == 0) {
        printf("rank 0 waited %.2f s for its idle peer using %.3f s CPU\n", wall, cpu);
        CHECK(wall >= 3.0 * timeout, "rank 0 waited only %.2f s", wall);
        CHECK(cpu < 0.25 * wall, "rank 0 used %.2f s CPU in a %.2f s wait: it spins", cpu, wall);
    }
    CHECK_STATUS(gdp_comm_sleep(comm, -1), GDP_STATUS_INVALID_ARGUMENT);
    /* the default stream: nothing to wait for without CUDA, an idle stream with a GPU; a CUDA
     * build on a machine without a GPU has no stream to ask (cudaStreamQuery fails) */
    gdp_ctx_t gpu = NULL;
    const bool no_cuda = !gdp_backend_available(GDP_BACKEND_CUDA);
    if (no_cuda || gdp_ctx_init(&gpu, GDP_BACKEND_CUDA, 0) == GDP_STATUS_SUCCESS)
        CHECK_OK(gdp_comm_stream_wait(comm, NULL));
    gdp_ctx_free(gpu);
    int64_t s = 0;
    CHECK_OK(gdp_watchdog_get_step(&s));
    CHECK(s == 7, "step %lld", (long long)s);
    gdp_comm_free(comm);
    int failures = g_test_failures, all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int rc = world == 0 ? test_finish("test_watchdog idle") : (failures ? 1 : 0);
    MPI_Finalize();
    return all ? 1 : rc;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "idle";
    if (strncmp(mode, "stall", 5) == 0)
        return run_stall(atoi(mode + 5));
    return run_idle();
}
