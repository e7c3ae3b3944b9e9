/*
 * test_rank_failure.c: one rank of an MPI job fails and the whole job ends, non-zero on
 * every rank, within seconds; nothing hangs. Run by tests/scripts/expect_job_failure.cmake,
 * which starts it under mpirun and asserts the exit code, the time and the messages.
 *
 *   abort: the last rank cannot open its checkpoint and ends the job through
 *          GDP_FATAL_IF_ERROR (gdp_fatal: "host:rank file:line message", then MPI_Abort)
 *          while the other ranks already wait inside an all-reduce it never joins.
 *   agree: the last rank's failure is shared with gdp_comm_agree; every rank learns it
 *          (the others as GDP_STATUS_REMOTE_ERROR naming the failing rank and its
 *          message), prints it, and exits 1 through MPI_Finalize: no abort needed.
 * Reaching the end of either mode without the failure is itself a failure (exit 0 would
 * be caught by the wrapper; the message "UNEXPECTED" says what happened).
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "gdp/checkpoint.h"
#include "gdp/comm.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "abort";
    gdp_comm_t comm = NULL;
    GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&comm, GDP_COMM_MPI, NULL, GDP_COMM_HOST_BUFFERS));
    int32_t rank = 0, size = 1;
    gdp_comm_rank(comm, &rank);
    gdp_comm_size(comm, &size);

    /* Only the last rank's checkpoint path is wrong: a per-rank failure. */
    const char *path = rank == size - 1 ? "/nonexistent/no-such-checkpoint.safetensors" : NULL;
    gdp_status_t st = GDP_STATUS_SUCCESS;
    gdp_checkpoint_t ck = NULL;
    if (path != NULL)
        st = gdp_checkpoint_open(&ck, path);

    if (strcmp(mode, "abort") == 0) {
        if (st != GDP_STATUS_SUCCESS)
            GDP_FATAL(comm, "rank %d cannot load its checkpoint: %s", rank, gdp_last_error());
        /* The healthy ranks block here: only the abort can end them. */
        float x = 1.0f;
        GDP_FATAL_IF_ERROR(comm, gdp_comm_allreduce(comm, &x, &x, 1, GDP_DTYPE_FP32, NULL));
        printf("UNEXPECTED: rank %d finished the all-reduce without its failed peer\n", rank);
    } else {
        gdp_status_t verdict = gdp_comm_agree(comm, st);
        if (verdict != GDP_STATUS_SUCCESS) {
            printf("rank %d: exiting with %s: %s\n", rank, gdp_status_string(verdict), gdp_last_error());
            fflush(stdout);
            gdp_checkpoint_free(ck);
            gdp_comm_free(comm);
            MPI_Finalize();
            return 1;
        }
        printf("UNEXPECTED: rank %d agreed on success although rank %d failed\n", rank, size - 1);
    }
    gdp_checkpoint_free(ck);
    gdp_comm_free(comm);
    MPI_Finalize();
    return 0;
}
