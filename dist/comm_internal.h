/*
 * comm_internal.h: what the comm front-end (comm.c) and its implementations
 * (comm_mpi.c, comm_nccl.c) and the watchdog (watchdog.c) share and users never see:
 * the backend vtable (struct gdp_comm_i), the comm struct, the MPI/CUDA check macros and
 * the helpers every backend uses (status agreement over MPI, GPU binding, bounded waits).
 */
#ifndef GDP_COMM_INTERNAL_H
#define GDP_COMM_INTERNAL_H

#include <mpi.h> /* defines: MPI_Comm, MPI_Error_string, ... */

#include "gdp/comm.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GDP_COMM_MAGIC 0x67646d63u /* "gdmc" */
#define GDP_BACKEND_API_VERSION 1

/* One comm implementation. The front-end has checked the handle, the pointers, the
 * dtype and the root before any slot is called. */
struct gdp_comm_i {
    gdp_status_t (*allreduce)(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                              void *stream);
    gdp_status_t (*allgather)(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                              void *stream);
    gdp_status_t (*reduce_scatter)(gdp_comm_t comm, const void *send, void *recv, size_t recv_count,
                                   gdp_dtype_t dtype, void *stream);
    gdp_status_t (*alltoall)(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                             void *stream);
    gdp_status_t (*bcast)(gdp_comm_t comm, void *buf, size_t count, gdp_dtype_t dtype, int32_t root, void *stream);
    gdp_status_t (*barrier)(gdp_comm_t comm, void *stream);
    /* Local: stop this rank's pending and future operations so peers are not waited on. */
    gdp_status_t (*abort)(gdp_comm_t comm);
    /* Releases the backend's context (not the MPI communicator: the front-end owns it). */
    void (*free)(gdp_comm_t comm);
};

struct gdp_comm {
    uint32_t           magic;
    struct gdp_comm_i  iface;
    void              *context;       /* the backend's own state                          */
    gdp_comm_backend_t backend;
    gdp_comm_buffers_t buffers;
    MPI_Comm           mpi;           /* our duplicate, MPI_ERRORS_RETURN                 */
    int32_t            rank, size;
    int32_t            local_rank, local_size; /* among this comm's ranks on this node    */
    int32_t            node_rank, node_size;   /* among the whole job's ranks on this node:
                                                * picks the GPU, so TP and CP sub-comms of
                                                * one rank bind the GPU that rank uses     */
    int32_t            world_rank;
    int32_t            device;        /* bound CUDA device, -1 with host buffers         */
    int32_t            aborted;       /* set by gdp_comm_abort: only free is valid after */
    char               name[64];      /* gdp_comm_name                                   */
    /* the watchdog (watchdog.c) */
    MPI_Comm           watch;         /* a second duplicate: the watchdog's probes only  */
    int64_t            ops;           /* waits begun on this comm: names the operation   */
    struct gdp_peer   *peers;         /* [size]: who each rank is, for the messages      */
    struct gdp_comm   *next_watched;  /* the process's live comms, whose probes a wait answers */
    uint32_t           magic_end;
};

/* Who a rank of a comm is (gathered at init): named when the watchdog finds it stalled. */
struct gdp_peer {
    int32_t world_rank;
    int32_t pid;
    char    host[56];
};

/* Records an MPI failure (MPI_Error_string of `err`) for `call` and returns GDP_STATUS_MPI_ERROR. */
gdp_status_t gdp_mpi_fail(int err, const char *call, const char *file, int line);
#define GDP_MPI_CHECK(call)                                                   \
    do {                                                                      \
        int gdp_mpi_err_ = (call);                                            \
        if (gdp_mpi_err_ != MPI_SUCCESS)                                      \
            return gdp_mpi_fail(gdp_mpi_err_, #call, __FILE__, __LINE__);     \
    } while (0)

#ifdef GDP_HAVE_CUDA
#include <cuda_runtime.h> /* defines: cudaMemcpyAsync, cudaSetDevice, ... */
#include "src/cuda_check.h" /* GDP_CUDA_CHECK */
#endif

/* gdp_comm_agree over comm->mpi of a comm being set up or live (its watch may be MPI_COMM_NULL). */
gdp_status_t gdp_comm_agree_mpi(struct gdp_comm *comm, gdp_status_t local_status);

/* ---- the watchdog (watchdog.c; comm.h documents the behaviour) ---- */
/* Waits for a nonblocking MPI operation `req` on `comm` (its MPI communicator) under the
 * step timeout: polls, sleeps instead of spinning once the wait is long (later the more
 * `bytes` the operation moves for this rank, as MPI moves them only inside our calls),
 * answers other ranks' probes, and past the timeout finds the stalled rank, records the
 * message, marks the watchdog fired and returns GDP_STATUS_REMOTE_ERROR. `what` names the
 * call. */
gdp_status_t gdp_watch_wait(struct gdp_comm *comm, MPI_Request *req, size_t bytes, const char *what);
/* Before a collective that moves `bytes` for each rank (equal on every rank): from 64 KB on,
 * waits at a barrier (free to sleep) until every rank of comm has arrived, so the data then
 * moves with every rank polling (comm.c says why). Every rank calls it with the same bytes. */
gdp_status_t gdp_comm_await_peers(struct gdp_comm *comm, size_t bytes, const char *what);
/* Fails (REMOTE_ERROR, the first firing's message) once the watchdog has fired: no comm
 * call starts new communication after that. */
gdp_status_t gdp_watch_check(const char *fn);
/* Init: the probe communicator and the peers (collective over comm->mpi), then joins the
 * live comms; leave: the reverse (local). */
gdp_status_t gdp_watch_join(struct gdp_comm *comm);
void         gdp_watch_leave(struct gdp_comm *comm);
#ifdef GDP_HAVE_CUDA
/* The same for the work queued on a CUDA stream (cudaStreamQuery polls); past the timeout it
 * also aborts the comm (ncclCommAbort), whose kernels would wait for the stalled peer forever. */
gdp_status_t gdp_watch_stream(struct gdp_comm *comm, void *stream, const char *what);
#endif
/* Reads GDP_WATCHDOG_TIMEOUT once (INVALID_ARGUMENT naming it when it is not a number >= 0). */
gdp_status_t gdp_watch_config(void);

/* Backend constructors: fill comm->iface, comm->context and comm->name. Called by
 * gdp_comm_init once comm->mpi, ranks and (for device buffers) the device are set.
 * They may communicate over comm->mpi; they return the same status on every rank. */
gdp_status_t gdp_comm_mpi_open(struct gdp_comm *comm);
gdp_status_t gdp_comm_nccl_open(struct gdp_comm *comm);

#ifdef __cplusplus
}
#endif

#endif /* GDP_COMM_INTERNAL_H */
