/*
 * comm_nccl.c: the NCCL implementation of the comm interface (the production path).
 * Rank 0 creates the ncclUniqueId, MPI_Bcast sends it to every rank, and each rank
 * joins with ncclCommInitRank on the GPU gdp_comm_init bound (local_rank % device_count).
 * Collectives are enqueued on the caller's stream on device buffers; alltoall is a
 * grouped send/recv per peer. Compiled only with GDP_HAVE_NCCL; otherwise the
 * constructor reports UNSUPPORTED.
 */
#include <stdio.h>
#include <string.h>

#include "comm_internal.h"

#ifdef GDP_HAVE_NCCL
#include <nccl.h> /* defines: ncclComm_t, ncclAllReduce, ncclGetErrorString, ... */

typedef struct nccl_context {
    ncclComm_t nccl;
} nccl_context;

static ncclComm_t nccl_of(gdp_comm_t comm) {
    nccl_context *ctx = comm->context;
    return ctx ? ctx->nccl : NULL;
}

/* Records a failing NCCL call with NCCL's error string and its last message. */
static gdp_status_t nccl_fail(ncclResult_t res, ncclComm_t nccl, const char *call, const char *file, int line) {
    const char *detail = ncclGetLastError(nccl);
    return gdp_set_error(GDP_STATUS_NCCL_ERROR, file, line, "%s failed: %s%s%s; rerun with NCCL_DEBUG=WARN", call,
                         ncclGetErrorString(res), detail && detail[0] ? ": " : "", detail ? detail : "");
}
#define GDP_NCCL_CHECK(nccl, call)                                               \
    do {                                                                         \
        ncclResult_t gdp_nccl_res_ = (call);                                     \
        if (gdp_nccl_res_ != ncclSuccess)                                        \
            return nccl_fail(gdp_nccl_res_, (nccl), #call, __FILE__, __LINE__);  \
    } while (0)

static ncclDataType_t nccl_dtype(gdp_dtype_t dtype) {
    switch (dtype) {
    case GDP_DTYPE_BF16: return ncclBfloat16;
    case GDP_DTYPE_FP16: return ncclFloat16;
    case GDP_DTYPE_INT32: return ncclInt32;
    default: return ncclFloat32;
    }
}

static gdp_status_t nccl_allreduce(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                                   void *stream) {
    ncclComm_t n = nccl_of(comm);
    GDP_NCCL_CHECK(n, ncclAllReduce(send, recv, count, nccl_dtype(dtype), ncclSum, n, (cudaStream_t)stream));
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t nccl_allgather(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                                   void *stream) {
    ncclComm_t n = nccl_of(comm);
    GDP_NCCL_CHECK(n, ncclAllGather(send, recv, count, nccl_dtype(dtype), n, (cudaStream_t)stream));
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t nccl_reduce_scatter(gdp_comm_t comm, const void *send, void *recv, size_t count,
                                        gdp_dtype_t dtype, void *stream) {
    ncclComm_t n = nccl_of(comm);
    GDP_NCCL_CHECK(n, ncclReduceScatter(send, recv, count, nccl_dtype(dtype), ncclSum, n, (cudaStream_t)stream));
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t nccl_alltoall(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                                  void *stream) {
    ncclComm_t n = nccl_of(comm);
    size_t bytes = count * gdp_dtype_size(dtype);
    GDP_NCCL_CHECK(n, ncclGroupStart());
    for (int32_t peer = 0; peer < comm->size; peer++) {
        ncclResult_t a = ncclSend((const char *)send + (size_t)peer * bytes, count, nccl_dtype(dtype), peer, n,
                                  (cudaStream_t)stream);
        ncclResult_t b = a == ncclSuccess ? ncclRecv((char *)recv + (size_t)peer * bytes, count, nccl_dtype(dtype),
                                                     peer, n, (cudaStream_t)stream)
                                          : a;
        if (b != ncclSuccess) {
            (void)ncclGroupEnd(); /* close the group before reporting */
            return nccl_fail(b, n, "ncclSend/ncclRecv (alltoall)", __FILE__, __LINE__);
        }
    }
    GDP_NCCL_CHECK(n, ncclGroupEnd());
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t nccl_bcast(gdp_comm_t comm, void *buf, size_t count, gdp_dtype_t dtype, int32_t root,
                               void *stream) {
    ncclComm_t n = nccl_of(comm);
    GDP_NCCL_CHECK(n, ncclBroadcast(buf, buf, count, nccl_dtype(dtype), root, n, (cudaStream_t)stream));
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t nccl_barrier(gdp_comm_t comm, void *stream) {
    /* Drain this rank's NCCL work first, so the barrier also orders device-side collectives. */
    GDP_CHECK(gdp_watch_stream(comm, stream, "gdp_comm_barrier (the stream's NCCL work)"));
    MPI_Request req = MPI_REQUEST_NULL;
    GDP_MPI_CHECK(MPI_Ibarrier(comm->mpi, &req));
    return gdp_watch_wait(comm, &req, 0, "gdp_comm_barrier");
}

static gdp_status_t nccl_abort(gdp_comm_t comm) {
    nccl_context *ctx = comm->context;
    if (ctx == NULL || ctx->nccl == NULL)
        return GDP_STATUS_SUCCESS;
    ncclComm_t n = ctx->nccl;
    ctx->nccl = NULL; /* aborted communicators are released by the abort itself */
    GDP_NCCL_CHECK(NULL, ncclCommAbort(n));
    return GDP_STATUS_SUCCESS;
}

static void nccl_free(gdp_comm_t comm) {
    nccl_context *ctx = comm->context;
    if (ctx == NULL)
        return;
    if (ctx->nccl != NULL)
        (void)ncclCommDestroy(ctx->nccl); /* teardown: nothing useful to do with an error */
    free(ctx);
    comm->context = NULL;
}

gdp_status_t gdp_comm_nccl_open(struct gdp_comm *comm) {
    nccl_context *ctx = gdp_calloc(1, sizeof *ctx, "the NCCL comm context");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    gdp_status_t st = ctx ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    if (st == GDP_STATUS_SUCCESS && comm->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            st = nccl_fail(r, NULL, "ncclGetUniqueId", __FILE__, __LINE__);
    }
    /* Every rank learns whether rank 0 has an id (and this rank its context) before the
     * broadcast and the collective ncclCommInitRank, so no rank waits on a failed one. */
    st = gdp_comm_agree_mpi(comm, st);
    if (st == GDP_STATUS_SUCCESS) {
        int err = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, comm->mpi);
        if (err != MPI_SUCCESS)
            st = gdp_mpi_fail(err, "MPI_Bcast(ncclUniqueId)", __FILE__, __LINE__);
    }
    if (st == GDP_STATUS_SUCCESS) {
        ncclResult_t r = ncclCommInitRank(&ctx->nccl, comm->size, id, comm->rank);
        if (r != ncclSuccess) {
            ctx->nccl = NULL;
            st = nccl_fail(r, NULL, "ncclCommInitRank", __FILE__, __LINE__);
        }
        st = gdp_comm_agree_mpi(comm, st);
    }
    if (st != GDP_STATUS_SUCCESS) {
        if (ctx && ctx->nccl)
            (void)ncclCommAbort(ctx->nccl);
        free(ctx);
        return st;
    }
    comm->context = ctx;
    comm->iface = (struct gdp_comm_i){
        .allreduce = nccl_allreduce,
        .allgather = nccl_allgather,
        .reduce_scatter = nccl_reduce_scatter,
        .alltoall = nccl_alltoall,
        .bcast = nccl_bcast,
        .barrier = nccl_barrier,
        .abort = nccl_abort,
        .free = nccl_free,
    };
    int version = 0;
    (void)ncclGetVersion(&version);
    /* NCCL >= 2.9 encodes X*10000 + Y*100 + Z. */
    snprintf(comm->name, sizeof comm->name, "nccl %d.%d.%d (device %d)", version / 10000, (version / 100) % 100,
             version % 100, comm->device);
    return GDP_STATUS_SUCCESS;
}

#else /* !GDP_HAVE_NCCL */

gdp_status_t gdp_comm_nccl_open(struct gdp_comm *comm) {
    (void)comm;
    GDP_FAIL(GDP_STATUS_UNSUPPORTED, "gdp_comm_init: this libgdp was built without NCCL; rebuild with "
             "-DGDP_WITH_CUDA=ON -DGDP_WITH_NCCL=ON, or use GDP_COMM_MPI");
}

#endif /* GDP_HAVE_NCCL */
