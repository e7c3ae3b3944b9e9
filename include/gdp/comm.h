/*
 * comm.h: the communication interface of gdp (tensor-parallel collectives), with two
 * implementations behind one opaque handle:
 *   - GDP_COMM_NCCL: the production path. Rank 0 creates the ncclUniqueId and
 *     broadcasts it over MPI; each rank binds the GPU local_rank % device_count, where
 *     local_rank comes from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Device buffers,
 *     asynchronous on the given stream.
 *   - GDP_COMM_MPI: host-staged reference and fallback (the CPU backend, or several
 *     ranks sharing one GPU, which NCCL refuses). Host buffers: synchronous, returns when
 *     the result is in `recv`. Device buffers: it waits for the stream's work, copies
 *     through host memory, and queues the copy of the result into `recv` on the stream
 *     (ordered with the stream's later work, as NCCL's results are).
 *
 * The caller initializes MPI (MPI_Init or MPI_Init_thread) before gdp_comm_init and
 * finalizes it after gdp_comm_free. MPI and CUDA types stay out of this header: an
 * MPI communicator is passed as a pointer to an MPI_Comm, a CUDA stream as void *
 * (cudaStream_t; NULL = the default stream; ignored for host buffers).
 *
 * Every function returns gdp_status_t; on failure gdp_last_error() names the call, the
 * values and the rank. Collectives must be called by every rank of the comm with the
 * same count and dtype; a rank that fails before a collective must not leave its peers
 * waiting: agree on the outcome first (gdp_comm_agree) or end the job (gdp_fatal).
 *
 * Every wait for the peers is bounded by the watchdog's step timeout (below): a stalled
 * rank makes its peers fail with a message naming it, instead of hanging them.
 *
 * Also here: the tensor-parallel output mode of a run (all-reduce after out_proj, or
 * sequence parallel: all-gather before in_proj and reduce-scatter after out_proj) and
 * gdp_fatal(), the one sanctioned way for a multi-rank program to die.
 */
#ifndef GDP_COMM_H
#define GDP_COMM_H

#include "gdp/gdp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gdp_comm *gdp_comm_t;
#define GDP_COMM_NULL NULL

typedef enum gdp_comm_backend {
    GDP_COMM_MPI = 0, /* host-staged MPI collectives                  */
    GDP_COMM_NCCL,    /* NCCL on device buffers (needs GDP_HAVE_NCCL) */
    GDP_COMM_BACKEND_NUM /* must be last */
} gdp_comm_backend_t;

/* Where the buffers passed to the collectives live. */
typedef enum gdp_comm_buffers {
    GDP_COMM_HOST_BUFFERS = 0,  /* host memory (MPI only)                                   */
    GDP_COMM_DEVICE_BUFFERS = 1 /* device memory of the comm's GPU (NCCL; MPI stages via host) */
} gdp_comm_buffers_t;

/* 1 if this build of the library has the comm backend, else 0 (MPI: always). */
GDP_API int gdp_comm_backend_available(gdp_comm_backend_t backend);
/* "mpi", "nccl" or "invalid". */
GDP_API const char *gdp_comm_backend_name(gdp_comm_backend_t backend);

/* Creates a comm over the ranks of *mpi_comm (a pointer to an MPI_Comm; NULL means
 * MPI_COMM_WORLD). Collective over those ranks. The MPI communicator is duplicated
 * (MPI_Comm_dup) with MPI_ERRORS_RETURN, so the caller's stays untouched.
 * With GDP_COMM_DEVICE_BUFFERS the comm binds the GPU local_rank % device_count
 * (cudaSetDevice on the calling thread; gdp_comm_device() reports it) so a context
 * created on that device shares it; NCCL also needs one GPU per rank on each node
 * (local_size <= device_count), else INVALID_ARGUMENT saying to use GDP_COMM_MPI.
 * Every rank returns the same outcome: if any rank fails, the others return
 * GDP_STATUS_REMOTE_ERROR naming that rank and its message. *out is NULL on failure.
 * Errors: INVALID_ARGUMENT (backend, buffers), UNSUPPORTED (NCCL or device buffers
 * in a build without them), INVALID_USAGE (MPI not initialized), MPI/NCCL/CUDA errors. */
GDP_API gdp_status_t gdp_comm_init(gdp_comm_t *out, gdp_comm_backend_t backend, const void *mpi_comm,
                                   gdp_comm_buffers_t buffers);
/* Frees the comm (ncclCommDestroy, MPI_Comm_free). Collective. NULL is a no-op. */
GDP_API gdp_status_t gdp_comm_free(gdp_comm_t comm);

/* Queries (no communication). */
GDP_API gdp_status_t gdp_comm_rank(gdp_comm_t comm, int32_t *rank);
GDP_API gdp_status_t gdp_comm_size(gdp_comm_t comm, int32_t *size);
/* Rank among the comm's ranks on this node, and how many there are. */
GDP_API gdp_status_t gdp_comm_local_rank(gdp_comm_t comm, int32_t *local_rank);
GDP_API gdp_status_t gdp_comm_local_size(gdp_comm_t comm, int32_t *local_size);
/* The CUDA device the comm bound (-1 with host buffers). */
GDP_API gdp_status_t gdp_comm_device(gdp_comm_t comm, int32_t *device);
GDP_API gdp_status_t gdp_comm_get_backend(gdp_comm_t comm, gdp_comm_backend_t *backend);
/* Implementation name, e.g. "mpi (host buffers)" or "nccl 2.27.3"; valid while comm lives. */
GDP_API gdp_status_t gdp_comm_name(gdp_comm_t comm, const char **name);

/* ---- collectives (sum is the only reduction) -------------------------------------
 * Counts are elements of `dtype` (fp32, bf16, fp16 or int32). Buffers are host or device
 * memory as chosen at init. NCCL: returns when the work is enqueued on `stream`.
 * MPI: returns when `recv` holds the result (device buffers: after the copy back on
 * `stream` has completed). bf16/fp16 sums: NCCL sums in its own order; MPI converts to
 * fp32, sums in fp32 and rounds once (to nearest even), so every rank gets the same bits.
 * Errors (nothing sent): INVALID_ARGUMENT for a NULL buffer with count > 0, a bad dtype,
 * a root outside [0, size), or a count over MPI's int range (split the call). */

/* recv[i] = sum over ranks of send[i], i < count. In-place if send == recv. */
GDP_API gdp_status_t gdp_comm_allreduce(gdp_comm_t comm, const void *send, void *recv, size_t count,
                                        gdp_dtype_t dtype, void *stream);
/* recv[r*count + i] = send of rank r [i]: recv holds size*count elements, in rank order.
 * In-place if send == recv + rank*count (in elements). */
GDP_API gdp_status_t gdp_comm_allgather(gdp_comm_t comm, const void *send, void *recv, size_t count,
                                        gdp_dtype_t dtype, void *stream);
/* recv[i] = sum over ranks of send[rank*recv_count + i]: send holds size*recv_count
 * elements, rank r keeps block r. In-place if recv == send + rank*recv_count. */
GDP_API gdp_status_t gdp_comm_reduce_scatter(gdp_comm_t comm, const void *send, void *recv, size_t recv_count,
                                             gdp_dtype_t dtype, void *stream);
/* Block r of send (count elements) goes to rank r; recv block r comes from rank r.
 * send and recv hold size*count elements each and must not overlap. */
GDP_API gdp_status_t gdp_comm_alltoall(gdp_comm_t comm, const void *send, void *recv, size_t count,
                                       gdp_dtype_t dtype, void *stream);
/* buf (count elements) of rank `root` is copied to every rank's buf. */
GDP_API gdp_status_t gdp_comm_bcast(gdp_comm_t comm, void *buf, size_t count, gdp_dtype_t dtype, int32_t root,
                                    void *stream);
/* Returns when every rank has entered the barrier (NCCL: after `stream` drains). */
GDP_API gdp_status_t gdp_comm_barrier(gdp_comm_t comm, void *stream);
/* Aborts the comm's pending and future operations (ncclCommAbort) so no rank waits
 * on this one; the comm must then only be freed. Local, not collective. */
GDP_API gdp_status_t gdp_comm_abort(gdp_comm_t comm);

/* ---- host-side agreement (over the comm's MPI communicator, whatever the backend) ---- */

/* Broadcasts `bytes` bytes of host memory from `root` (e.g. a step plan). */
GDP_API gdp_status_t gdp_comm_host_bcast(gdp_comm_t comm, void *buf, size_t bytes, int32_t root);

/* Every rank passes the status of its own part of a step; every rank returns the same
 * verdict: SUCCESS if all succeeded; otherwise a failing rank returns its own status
 * (its message kept) and the others GDP_STATUS_REMOTE_ERROR with a message naming the
 * lowest failing rank and that rank's error message. Collective. */
GDP_API gdp_status_t gdp_comm_agree(gdp_comm_t comm, gdp_status_t local_status);

/* Hashes `bytes` bytes of host memory (64-bit FNV-1a) and compares the hashes of all
 * ranks (all-reduced min and max). SUCCESS on every rank if all hold identical bytes,
 * else INVALID_USAGE on every rank with a message naming `what` and the ranks' hashes.
 * Collective; `bytes` may differ across ranks (that is also a mismatch). */
GDP_API gdp_status_t gdp_comm_check_consistent(gdp_comm_t comm, const void *host_buf, size_t bytes,
                                               const char *what);

/* ---- the watchdog (docs/failures.md) -------------------------------------------------
 * Every wait of a comm for its peers is bounded by a step timeout: the MPI backend's
 * collectives (and their host staging of device buffers), gdp_comm_agree,
 * gdp_comm_host_bcast, gdp_comm_check_consistent, gdp_comm_barrier and
 * gdp_comm_stream_wait. A wait polls (MPI_Test / cudaStreamQuery): 50 us at full speed,
 * then yielding the CPU between polls up to 2 ms (an MPI wait: longer by its bytes at
 * 250 MB/s, as MPI moves data only inside its calls), then sleeping in steps growing to
 * 1 ms, so a short wait costs well under a microsecond more than a blocking call and a rank
 * waiting for a stalled peer uses almost no CPU. The MPI backend's collectives and
 * gdp_comm_host_bcast start a transfer of 64 KB or more per rank once every rank has
 * arrived (one small barrier first). When one wait passes the timeout, the rank probes every rank
 * of the comm (a small message on a private duplicate of its communicator, answered by
 * any rank that is inside a gdp wait or gdp_comm_sleep) and then:
 *   - a rank that does not answer within the grace time (timeout / 4, in [0.5, 5] s) is
 *     stalled: the wait fails with GDP_STATUS_REMOTE_ERROR, the message naming that rank
 *     (comm rank, world rank, host, pid), this rank's step (gdp_watchdog_set_step) and
 *     the operation it waited in, and what the answering ranks wait for;
 *   - every rank answers and one is idle (gdp_comm_sleep): the wait goes on;
 *   - every rank answers but the operation does not complete within a second timeout
 *     (mismatched collectives, a hung GPU under NCCL): it fails listing each rank's wait.
 * With device buffers a failing stream wait also aborts the comm (ncclCommAbort).
 * After a failure the watchdog has fired: every later comm call of this process fails at
 * once with that message, and the program must end the job (gdp_fatal / MPI_Abort):
 * MPI still owns the buffers of the operation that timed out, and MPI_Finalize would
 * wait for the stalled rank.
 * The timeout is GDP_WATCHDOG_TIMEOUT (seconds; 0 turns the watchdog off; read by the first
 * gdp_comm_init, which fails naming a value that is not a number >= 0) unless
 * gdp_watchdog_set_timeout sets it. Process-wide, for every comm. */
#define GDP_WATCHDOG_DEFAULT_TIMEOUT_S 300.0
GDP_API gdp_status_t gdp_watchdog_set_timeout(double seconds); /* [0, 1e9]; 0: off */
GDP_API gdp_status_t gdp_watchdog_get_timeout(double *seconds);
/* The step this process is at (e.g. the engine's step number), named in the watchdog's
 * messages; -1 (the start): none. Local, no communication. */
GDP_API gdp_status_t gdp_watchdog_set_step(int64_t step);
GDP_API gdp_status_t gdp_watchdog_get_step(int64_t *step);
/* 1 once a wait of this process failed by the timeout, else 0. */
GDP_API int gdp_watchdog_fired(void);
/* Sleeps `seconds` while answering the watchdog's probes as idle, so peers waiting for this
 * rank meanwhile (e.g. for a scheduler waiting for an arrival) keep waiting. Local. */
GDP_API gdp_status_t gdp_comm_sleep(gdp_comm_t comm, double seconds);
/* Waits for the work queued on `stream` (cudaStream_t, NULL: the default stream), bounded by
 * the step timeout like the comm's own waits: where a host would call cudaStreamSynchronize
 * on a stream that runs NCCL collectives. A build without CUDA returns SUCCESS at once. */
GDP_API gdp_status_t gdp_comm_stream_wait(gdp_comm_t comm, void *stream);
/* The same bounded wait for one event (cudaEvent_t) recorded on a stream: the work queued
 * before it, not what was queued after (the engine waits for step n while step n + 1 is
 * queued behind it). */
GDP_API gdp_status_t gdp_comm_event_wait(gdp_comm_t comm, void *event);

/* ---- tensor-parallel output mode of a layer (chosen per run) ------------------------ */
typedef enum gdp_tp_mode {
    GDP_TP_MODE_ALLREDUCE = 0,     /* replicated tokens; all-reduce after out_proj               */
    GDP_TP_MODE_SEQUENCE_PARALLEL, /* tokens sharded: all-gather before in_proj, reduce-scatter after */
    GDP_TP_MODE_NUM /* must be last */
} gdp_tp_mode_t;

/* "allreduce" or "sp" (also accepted by gdp_tp_mode_parse: "sequence-parallel"). */
GDP_API const char *gdp_tp_mode_name(gdp_tp_mode_t mode);
GDP_API gdp_status_t gdp_tp_mode_parse(const char *text, gdp_tp_mode_t *mode);

/* Before in_proj: the tokens this rank feeds into its GEMM.
 *   ALLREDUCE: x_local is already [tokens, hidden] on every rank: copied to x_full
 *              (skipped when x_full == x_local).
 *   SP:        x_local [tokens/size, hidden] -> x_full [tokens, hidden] (all-gather in
 *              rank order); tokens % size must be 0 (INVALID_ARGUMENT naming both). */
GDP_API gdp_status_t gdp_comm_tp_gather_input(gdp_comm_t comm, gdp_tp_mode_t mode, const void *x_local,
                                              void *x_full, int64_t tokens, int64_t hidden, gdp_dtype_t dtype,
                                              void *stream);
/* After out_proj: partial [tokens, hidden] (this rank's row-parallel product) ->
 *   ALLREDUCE: out [tokens, hidden], the sum over ranks (in-place if out == partial);
 *   SP:        out [tokens/size, hidden], this rank's token block of the sum. */
GDP_API gdp_status_t gdp_comm_tp_reduce_output(gdp_comm_t comm, gdp_tp_mode_t mode, const void *partial,
                                               void *out, int64_t tokens, int64_t hidden, gdp_dtype_t dtype,
                                               void *stream);

/* ---- the fatal path (tests, examples and launchers only; the library never calls it) ----
 * Prints "host:rank file:line message" to stderr, runs the abort callback, aborts the
 * comm (ncclCommAbort; comm may be NULL) and calls MPI_Abort(MPI_COMM_WORLD, 1), which
 * ends every rank of the job. Never returns. Unlike everything else in gdp it returns
 * no status: it is the last resort of a program that cannot go on. */
GDP_API void gdp_fatal(gdp_comm_t comm, const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
/* A function gdp_fatal calls before aborting (flush logs, dump state); NULL clears it. */
typedef void (*gdp_abort_callback_t)(void *user_data);
GDP_API gdp_status_t gdp_set_abort_callback(gdp_abort_callback_t callback, void *user_data);

#define GDP_FATAL(comm, ...) gdp_fatal((comm), __FILE__, __LINE__, __VA_ARGS__)
/* Ends the job unless `call` succeeds, with the call and gdp_last_error() in the message. */
#define GDP_FATAL_IF_ERROR(comm, call)                                                               \
    do {                                                                                             \
        gdp_status_t gdp_fatal_st_ = (call);                                                         \
        if (gdp_fatal_st_ != GDP_STATUS_SUCCESS)                                                     \
            gdp_fatal((comm), __FILE__, __LINE__, "%s failed: %s: %s", #call,                        \
                      gdp_status_string(gdp_fatal_st_), gdp_last_error());                           \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* GDP_COMM_H */
