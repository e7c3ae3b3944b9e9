/*
 * comm_mpi.c: the MPI implementation of the comm interface: host-staged collectives for
 * the CPU backend and for GPUs shared by several ranks (which NCCL refuses).
 *   - Host buffers go to MPI directly; device buffers are copied to page-locked host
 *     staging buffers on the caller's stream (waited for), reduced there and copied back in
 *     stream order (not waited for: the next use of staging waits for that copy).
 *   - A collective of 64 KB or more per rank starts once every rank has arrived
 *     (gdp_comm_await_peers): MPI moves its fragments only while both sides poll.
 *   - Sums of bf16/fp16 are converted to fp32, summed by MPI in fp32 and rounded once
 *     (to nearest even), so every rank gets the same bits and no precision is lost
 *     to per-step 16-bit rounding.
 *   - Data movement is in bytes (MPI_BYTE), so each rank's share must fit in an int.
 *   - Every collective is nonblocking MPI waited for by the watchdog (gdp_watch_wait), and
 *     every device copy by a bounded stream wait: a stalled peer fails the wait, named.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "comm_internal.h"

typedef struct mpi_context {
    void  *stage[2];        /* host staging buffers (device buffers, in-place reduce-scatter) */
    size_t stage_bytes[2];
    bool   pin_staging;     /* device buffers: staging in page-locked memory, copies at full link speed */
    bool   stage_pinned[2]; /* this staging buffer is page-locked (cudaFreeHost frees it)              */
#ifdef GDP_HAVE_CUDA
    cudaEvent_t copied_back;  /* recorded after the last copy from staging to the device */
    bool   copy_back_pending; /* that copy may still read staging: wait before reusing it */
#endif
    float *sum;             /* fp32 accumulation buffer for bf16/fp16 sums                   */
    size_t sum_count;
} mpi_context;

static gdp_status_t grow(void **buf, size_t *have, size_t need, const char *what) {
    if (need <= *have)
        return GDP_STATUS_SUCCESS;
    void *p = realloc(*buf, need);
    if (p == NULL)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "comm (mpi): out of memory growing %s to %zu bytes", what, need);
    *buf = p;
    *have = need;
    return GDP_STATUS_SUCCESS;
}

static void stage_free(mpi_context *ctx, int i) {
#ifdef GDP_HAVE_CUDA
    if (ctx->stage_pinned[i])
        (void)cudaFreeHost(ctx->stage[i]);
    else
#endif
        free(ctx->stage[i]);
    ctx->stage[i] = NULL;
    ctx->stage_bytes[i] = 0;
    ctx->stage_pinned[i] = false;
}

/* Staging buffer i of at least `bytes`. Pinned staging grows to the next power of two, so the
 * steps' varying sizes reallocate it (a synchronizing cudaFreeHost) a few times, not every
 * step; where page-locked memory runs out it falls back to pageable memory (slower copies,
 * same results) rather than fail one rank inside a collective its peers have entered. */
static gdp_status_t stage(mpi_context *ctx, int i, size_t bytes, void **out) {
#ifdef GDP_HAVE_CUDA
    if (ctx->pin_staging && bytes > ctx->stage_bytes[i]) {
        size_t want = 4096;
        while (want < bytes)
            want *= 2;
        stage_free(ctx, i);
        /* portable: the lazily made buffer serves whatever context the comm's ranks use */
        if (cudaHostAlloc(&ctx->stage[i], want, cudaHostAllocPortable) == cudaSuccess) {
            ctx->stage_bytes[i] = want;
            ctx->stage_pinned[i] = true;
        } else {
            (void)cudaGetLastError(); /* the failed allocation leaves no sticky error; clear the last one */
            ctx->stage[i] = NULL;
            ctx->pin_staging = false;
        }
    }
    if (ctx->stage_pinned[i] && bytes > ctx->stage_bytes[i])
        stage_free(ctx, i); /* pinned before the fallback: realloc must not see it */
#endif
    GDP_CHECK(grow(&ctx->stage[i], &ctx->stage_bytes[i], bytes ? bytes : 1, "a host staging buffer"));
    *out = ctx->stage[i];
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t sum_buffer(mpi_context *ctx, size_t count, float **out) {
    size_t have = ctx->sum_count * sizeof(float);
    void *p = ctx->sum;
    GDP_CHECK(grow(&p, &have, (count ? count : 1) * sizeof(float), "the fp32 sum buffer"));
    ctx->sum = p;
    ctx->sum_count = have / sizeof(float);
    *out = ctx->sum;
    return GDP_STATUS_SUCCESS;
}

/* Each MPI call takes an int count: the per-rank share in bytes (or fp32 elements) must fit. */
static gdp_status_t check_int_count(const char *fn, size_t count, gdp_dtype_t dtype) {
    size_t bytes = count * gdp_dtype_size(dtype);
    if (bytes > (size_t)INT_MAX || count * sizeof(float) > (size_t)INT_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s (mpi): count = %zu elements of %s per rank exceeds what one MPI call moves (%d bytes); split "
                 "the call into smaller pieces",
                 fn, count, gdp_dtype_name(dtype), INT_MAX);
    return GDP_STATUS_SUCCESS;
}

static void to_f32(float *dst, const void *src, size_t n, gdp_dtype_t dtype) {
    const uint16_t *h = src;
    if (dtype == GDP_DTYPE_BF16)
        for (size_t i = 0; i < n; i++)
            dst[i] = gdp_bf16_to_float(h[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = gdp_fp16_to_float(h[i]);
}

static void from_f32(void *dst, const float *src, size_t n, gdp_dtype_t dtype) {
    uint16_t *h = dst;
    if (dtype == GDP_DTYPE_BF16)
        for (size_t i = 0; i < n; i++)
            h[i] = gdp_float_to_bf16(src[i]);
    else
        for (size_t i = 0; i < n; i++)
            h[i] = gdp_float_to_fp16(src[i]);
}

/* Starts a nonblocking collective (the expression, which sets `req`) once every rank is
 * there (gdp_comm_await_peers) and waits for it; `bytes`, the larger of what this rank sends and
 * receives (equal on every rank), tells both waits how long data may still be moving. */
#define MPI_WAIT(comm, call, bytes, what)                                                   \
    do {                                                                                    \
        MPI_Request req = MPI_REQUEST_NULL;                                                 \
        GDP_CHECK(gdp_comm_await_peers((comm), (bytes), (what)));                           \
        GDP_MPI_CHECK(call);                                                                \
        GDP_CHECK(gdp_watch_wait((comm), &req, (bytes), (what)));                           \
    } while (0)

static bool is_half(gdp_dtype_t dtype) { return dtype == GDP_DTYPE_BF16 || dtype == GDP_DTYPE_FP16; }
static MPI_Datatype sum_type(gdp_dtype_t dtype) { return dtype == GDP_DTYPE_INT32 ? MPI_INT32_T : MPI_FLOAT; }

/* ---- host collectives (all pointers host memory) ------------------------------------ */
static gdp_status_t host_allreduce(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype) {
    mpi_context *ctx = comm->context;
    if (is_half(dtype)) {
        float *acc;
        GDP_CHECK(sum_buffer(ctx, count, &acc));
        to_f32(acc, send, count, dtype);
        MPI_WAIT(comm, MPI_Iallreduce(MPI_IN_PLACE, acc, (int)count, MPI_FLOAT, MPI_SUM, comm->mpi, &req),
                 count * sizeof(float), "gdp_comm_allreduce");
        from_f32(recv, acc, count, dtype);
        return GDP_STATUS_SUCCESS;
    }
    MPI_WAIT(comm, MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, sum_type(dtype), MPI_SUM,
                                  comm->mpi, &req), count * gdp_dtype_size(dtype), "gdp_comm_allreduce");
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t host_allgather(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype) {
    size_t bytes = count * gdp_dtype_size(dtype);
    bool in_place = send == (const char *)recv + (size_t)comm->rank * bytes;
    MPI_WAIT(comm, MPI_Iallgather(in_place ? MPI_IN_PLACE : send, in_place ? 0 : (int)bytes, MPI_BYTE, recv,
                                  (int)bytes, MPI_BYTE, comm->mpi, &req), bytes * (size_t)comm->size,
             "gdp_comm_allgather");
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t host_reduce_scatter(gdp_comm_t comm, const void *send, void *recv, size_t count,
                                        gdp_dtype_t dtype) {
    mpi_context *ctx = comm->context;
    size_t total = count * (size_t)comm->size;
    if (is_half(dtype)) {
        /* MPI_IN_PLACE leaves this rank's block at the start of the buffer. */
        float *acc;
        GDP_CHECK(sum_buffer(ctx, total, &acc));
        to_f32(acc, send, total, dtype);
        MPI_WAIT(comm, MPI_Ireduce_scatter_block(MPI_IN_PLACE, acc, (int)count, MPI_FLOAT, MPI_SUM, comm->mpi, &req),
                 total * sizeof(float), "gdp_comm_reduce_scatter");
        from_f32(recv, acc, count, dtype);
        return GDP_STATUS_SUCCESS;
    }
    size_t es = gdp_dtype_size(dtype), bytes = count * es;
    const char *s = send;
    char *r = recv;
    if (bytes > 0 && r < s + total * es && s < r + bytes) {
        /* recv aliases send (e.g. in place at block `rank`): reduce into staging first. */
        void *tmp;
        GDP_CHECK(stage(ctx, 1, bytes, &tmp));
        MPI_WAIT(comm, MPI_Ireduce_scatter_block(send, tmp, (int)count, sum_type(dtype), MPI_SUM, comm->mpi, &req),
                 total * es, "gdp_comm_reduce_scatter");
        memcpy(recv, tmp, bytes);
        return GDP_STATUS_SUCCESS;
    }
    MPI_WAIT(comm, MPI_Ireduce_scatter_block(send, recv, (int)count, sum_type(dtype), MPI_SUM, comm->mpi, &req),
             total * es, "gdp_comm_reduce_scatter");
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t host_alltoall(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype) {
    int bytes = (int)(count * gdp_dtype_size(dtype));
    MPI_WAIT(comm, MPI_Ialltoall(send, bytes, MPI_BYTE, recv, bytes, MPI_BYTE, comm->mpi, &req),
             (size_t)bytes * (size_t)comm->size, "gdp_comm_alltoall");
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t host_bcast(gdp_comm_t comm, void *buf, size_t count, gdp_dtype_t dtype, int32_t root) {
    MPI_WAIT(comm, MPI_Ibcast(buf, (int)(count * gdp_dtype_size(dtype)), MPI_BYTE, root, comm->mpi, &req),
             count * gdp_dtype_size(dtype), "gdp_comm_bcast");
    return GDP_STATUS_SUCCESS;
}

/* ---- device staging ---------------------------------------------------------------- */
#ifdef GDP_HAVE_CUDA
/* Staging is free to reuse once the last copy back from it has run (copy_back): a wait on its
 * event, bounded by the watchdog, usually already complete (the stream has moved on). */
static gdp_status_t staging_idle(gdp_comm_t comm) {
    mpi_context *ctx = comm->context;
    if (!ctx->copy_back_pending)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(gdp_comm_event_wait(comm, ctx->copied_back));
    ctx->copy_back_pending = false;
    return GDP_STATUS_SUCCESS;
}

/* The copy of a collective's result from staging to the device, in stream order and not
 * waited for: the caller's stream orders its later work after it (as NCCL's results are), and
 * the next use of staging waits for the event (staging_idle). Saves a host round trip a
 * collective, which two ranks time-sharing one GPU pay in context switches. */
static gdp_status_t copy_back(gdp_comm_t comm, void *dst, const void *src, size_t bytes, void *stream) {
    mpi_context *ctx = comm->context;
    if (bytes == 0)
        return GDP_STATUS_SUCCESS;
    if (ctx->copied_back == NULL)
        GDP_CUDA_CHECK(cudaEventCreateWithFlags(&ctx->copied_back, cudaEventDisableTiming));
    GDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
    GDP_CUDA_CHECK(cudaEventRecord(ctx->copied_back, (cudaStream_t)stream));
    ctx->copy_back_pending = true;
    return GDP_STATUS_SUCCESS;
}

/* A collective's input from the device into staging, waited for (MPI reads it next); the copy
 * waits for the stream's earlier work too (e.g. a GEMM): bounded by the watchdog. */
static gdp_status_t copy_to_host(gdp_comm_t comm, void *dst, const void *src, size_t bytes, void *stream) {
    if (bytes == 0)
        return GDP_STATUS_SUCCESS;
    GDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    return gdp_watch_stream(comm, stream, "a host-staging copy (cudaMemcpyAsync)");
}

/* A host collective (host_allreduce, host_allgather, ...): all pointers host memory. */
typedef gdp_status_t (*host_collective)(gdp_comm_t comm, const void *send, void *recv, size_t count,
                                        gdp_dtype_t dtype);

/* Device buffers: send_bytes of send copied to host staging buffer 0, the host collective from
 * there into staging buffer 1 (never aliased, so no collective needs its in-place path), and
 * recv_bytes of that copied back to recv in stream order (copy_back). */
static gdp_status_t staged(gdp_comm_t comm, host_collective op, const void *send, size_t send_bytes, void *recv,
                           size_t recv_bytes, size_t count, gdp_dtype_t dtype, void *stream) {
    void *hs, *hr;
    GDP_CHECK(staging_idle(comm));
    GDP_CHECK(stage(comm->context, 0, send_bytes, &hs));
    GDP_CHECK(stage(comm->context, 1, recv_bytes, &hr));
    GDP_CHECK(copy_to_host(comm, hs, send, send_bytes, stream));
    GDP_CHECK(op(comm, hs, hr, count, dtype));
    return copy_back(comm, recv, hr, recv_bytes, stream);
}
#endif

static bool on_device(gdp_comm_t comm) { return comm->buffers == GDP_COMM_DEVICE_BUFFERS; }

/* Device buffers are only possible in CUDA builds (gdp_comm_init refuses them otherwise),
 * so each collective's staged path sits under GDP_HAVE_CUDA. */

static gdp_status_t mpi_allreduce(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                                  void *stream) {
    GDP_CHECK(check_int_count("gdp_comm_allreduce", count, dtype));
#ifdef GDP_HAVE_CUDA
    if (on_device(comm)) {
        const size_t bytes = count * gdp_dtype_size(dtype);
        return staged(comm, host_allreduce, send, bytes, recv, bytes, count, dtype, stream);
    }
#endif
    return host_allreduce(comm, send, recv, count, dtype);
}

static gdp_status_t mpi_allgather(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                                  void *stream) {
    GDP_CHECK(check_int_count("gdp_comm_allgather", count, dtype));
#ifdef GDP_HAVE_CUDA
    if (on_device(comm)) {
        const size_t bytes = count * gdp_dtype_size(dtype);
        return staged(comm, host_allgather, send, bytes, recv, bytes * (size_t)comm->size, count, dtype, stream);
    }
#endif
    return host_allgather(comm, send, recv, count, dtype);
}

static gdp_status_t mpi_reduce_scatter(gdp_comm_t comm, const void *send, void *recv, size_t count,
                                       gdp_dtype_t dtype, void *stream) {
    GDP_CHECK(check_int_count("gdp_comm_reduce_scatter", count, dtype));
#ifdef GDP_HAVE_CUDA
    if (on_device(comm)) {
        const size_t bytes = count * gdp_dtype_size(dtype);
        return staged(comm, host_reduce_scatter, send, bytes * (size_t)comm->size, recv, bytes, count, dtype, stream);
    }
#endif
    return host_reduce_scatter(comm, send, recv, count, dtype);
}

static gdp_status_t mpi_alltoall(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                                 void *stream) {
    GDP_CHECK(check_int_count("gdp_comm_alltoall", count, dtype));
#ifdef GDP_HAVE_CUDA
    if (on_device(comm)) {
        const size_t bytes = count * gdp_dtype_size(dtype) * (size_t)comm->size;
        return staged(comm, host_alltoall, send, bytes, recv, bytes, count, dtype, stream);
    }
#endif
    return host_alltoall(comm, send, recv, count, dtype);
}

static gdp_status_t mpi_bcast(gdp_comm_t comm, void *buf, size_t count, gdp_dtype_t dtype, int32_t root,
                              void *stream) {
    GDP_CHECK(check_int_count("gdp_comm_bcast", count, dtype));
#ifdef GDP_HAVE_CUDA
    if (on_device(comm)) {
        size_t bytes = count * gdp_dtype_size(dtype);
        void *h;
        GDP_CHECK(staging_idle(comm));
        GDP_CHECK(stage(comm->context, 0, bytes, &h));
        if (comm->rank == root)
            GDP_CHECK(copy_to_host(comm, h, buf, bytes, stream));
        GDP_CHECK(host_bcast(comm, h, count, dtype, root));
        if (comm->rank == root)
            return GDP_STATUS_SUCCESS;
        return copy_back(comm, buf, h, bytes, stream);
    }
#endif
    return host_bcast(comm, buf, count, dtype, root);
}

static gdp_status_t mpi_barrier(gdp_comm_t comm, void *stream) {
#ifdef GDP_HAVE_CUDA
    if (on_device(comm))
        GDP_CHECK(gdp_watch_stream(comm, stream, "gdp_comm_barrier (the stream's work)"));
#endif
    MPI_WAIT(comm, MPI_Ibarrier(comm->mpi, &req), 0, "gdp_comm_barrier");
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t mpi_abort(gdp_comm_t comm) {
    /* Host MPI collectives cannot be cancelled; the front-end refuses further calls, and
     * ending the peers is MPI_Abort's job (gdp_fatal), not the library's. */
    return GDP_STATUS_SUCCESS;
}

static void mpi_free(gdp_comm_t comm) {
    mpi_context *ctx = comm->context;
    if (ctx == NULL)
        return;
#ifdef GDP_HAVE_CUDA
    if (ctx->copied_back != NULL) {
        (void)cudaEventSynchronize(ctx->copied_back); /* the last copy back read staging */
        (void)cudaEventDestroy(ctx->copied_back);
    }
#endif
    stage_free(ctx, 0);
    stage_free(ctx, 1);
    free(ctx->sum);
    free(ctx);
    comm->context = NULL;
}

gdp_status_t gdp_comm_mpi_open(struct gdp_comm *comm) {
    mpi_context *ctx = gdp_calloc(1, sizeof *ctx, "the MPI comm context");
    gdp_status_t st = gdp_comm_agree_mpi(comm, ctx ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR);
    if (st != GDP_STATUS_SUCCESS) {
        free(ctx);
        return st;
    }
    comm->context = ctx;
#ifdef GDP_HAVE_CUDA
    ctx->pin_staging = on_device(comm);
#endif
    comm->iface = (struct gdp_comm_i){
        .allreduce = mpi_allreduce,
        .allgather = mpi_allgather,
        .reduce_scatter = mpi_reduce_scatter,
        .alltoall = mpi_alltoall,
        .bcast = mpi_bcast,
        .barrier = mpi_barrier,
        .abort = mpi_abort,
        .free = mpi_free,
    };
    int version = 0, subversion = 0;
    MPI_Get_version(&version, &subversion);
    snprintf(comm->name, sizeof comm->name, "mpi %d.%d (%s buffers)", version, subversion,
             on_device(comm) ? "device, host-staged" : "host");
    return GDP_STATUS_SUCCESS;
}
