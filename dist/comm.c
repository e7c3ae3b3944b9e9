/*
 * comm.c: the comm front-end of comm.h: initialization (MPI duplicate, node-local rank,
 * GPU binding, backend choice), argument checks before each vtable call, the host-side
 * agreement helpers (status agreement, consistency hashes, host broadcast), the
 * tensor-parallel input/output collectives, and gdp_fatal. Every wait for the peers goes
 * through the watchdog (watchdog.c): nonblocking MPI plus gdp_watch_wait.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_internal.h"
#include "src/phase.h"

/* ---- errors ------------------------------------------------------------------------ */
gdp_status_t gdp_mpi_fail(int err, const char *call, const char *file, int line) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(err, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d", err);
    return gdp_set_error(GDP_STATUS_MPI_ERROR, file, line, "%s failed: %s", call, text);
}

/* ---- backends ---------------------------------------------------------------------- */
int gdp_comm_backend_available(gdp_comm_backend_t backend) {
    if (backend == GDP_COMM_MPI)
        return 1;
#ifdef GDP_HAVE_NCCL
    if (backend == GDP_COMM_NCCL)
        return 1;
#endif
    return 0;
}

const char *gdp_comm_backend_name(gdp_comm_backend_t backend) {
    switch (backend) {
    case GDP_COMM_MPI: return "mpi";
    case GDP_COMM_NCCL: return "nccl";
    default: return "invalid";
    }
}

static gdp_status_t comm_check(gdp_comm_t comm, const char *fn) {
    if (comm == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: comm is NULL; create one with gdp_comm_init()", fn);
    if (comm->magic != GDP_COMM_MAGIC || comm->magic_end != GDP_COMM_MAGIC)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: comm %p is not a live gdp comm (freed or corrupted)", fn,
                 (void *)comm);
    return GDP_STATUS_SUCCESS;
}

/* Like comm_check, and also refuses a comm that was aborted, or any comm once the
 * watchdog fired. */
static gdp_status_t comm_check_live(gdp_comm_t comm, const char *fn) {
    GDP_CHECK(comm_check(comm, fn));
    GDP_CHECK(gdp_watch_check(fn));
    if (comm->aborted)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: comm was aborted (gdp_comm_abort); only gdp_comm_free is valid now",
                 fn);
    return GDP_STATUS_SUCCESS;
}

/* ---- agreement --------------------------------------------------------------------- */
/* The buffers of the agreement's collectives, on the heap: when the watchdog gives up on
 * one, MPI may still write into them later, so they are then left to it, never freed. */
typedef struct agree_buffers {
    int in[2], verdict[2];
    struct {
        int  status;
        char message[1536];
    } report;
} agree_buffers;

gdp_status_t gdp_comm_agree_mpi(struct gdp_comm *c, gdp_status_t local_status) {
    GDP_CHECK(gdp_watch_check("gdp_comm_agree"));
    agree_buffers *b = malloc(sizeof *b);
    if (b == NULL)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "gdp_comm_agree: out of memory (%zu bytes)", sizeof *b);
    /* MINLOC over (ok, rank): the minimum is 0 iff some rank failed, and its location is
     * the lowest failing rank, whose status and message everyone then receives. */
    b->in[0] = local_status == GDP_STATUS_SUCCESS ? 1 : 0;
    b->in[1] = c->rank;
    b->verdict[0] = 1, b->verdict[1] = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    int err = MPI_Iallreduce(b->in, b->verdict, 1, MPI_2INT, MPI_MINLOC, c->mpi, &req);
    if (err != MPI_SUCCESS) {
        free(b);
        return gdp_mpi_fail(err, "MPI_Iallreduce(agree)", __FILE__, __LINE__);
    }
    gdp_status_t st = gdp_watch_wait(c, &req, 0, "gdp_comm_agree");
    if (st != GDP_STATUS_SUCCESS)
        return st; /* b stays MPI's */
    if (b->verdict[0] == 1) {
        free(b);
        return GDP_STATUS_SUCCESS;
    }
    const int failed = b->verdict[1];
    memset(&b->report, 0, sizeof b->report);
    if (c->rank == failed) {
        b->report.status = (int)local_status;
        snprintf(b->report.message, sizeof b->report.message, "%s", gdp_last_error());
    }
    err = MPI_Ibcast(&b->report, (int)sizeof b->report, MPI_BYTE, failed, c->mpi, &req);
    if (err != MPI_SUCCESS) {
        free(b);
        return gdp_mpi_fail(err, "MPI_Ibcast(agree report)", __FILE__, __LINE__);
    }
    st = gdp_watch_wait(c, &req, 0, "gdp_comm_agree (the failure report)");
    if (st != GDP_STATUS_SUCCESS)
        return st;
    if (local_status != GDP_STATUS_SUCCESS) {
        free(b);
        return local_status; /* keep this rank's own message */
    }
    st = GDP_ERROR(GDP_STATUS_REMOTE_ERROR, "rank %d failed with \"%s\": %s", failed,
                   gdp_status_string((gdp_status_t)b->report.status), b->report.message);
    free(b);
    return st;
}

gdp_status_t gdp_comm_agree(gdp_comm_t comm, gdp_status_t local_status) {
    GDP_CHECK(comm_check(comm, "gdp_comm_agree"));
    return gdp_comm_agree_mpi(comm, local_status);
}

/* ---- init / free ------------------------------------------------------------------- */
#ifdef GDP_HAVE_CUDA
/* Binds GPU node_rank % device_count, node_rank being the rank's place among the job's ranks
 * on this node (not among this comm's: a TP or CP sub-comm must bind the GPU its rank uses
 * in every other comm); with `exclusive` (NCCL) each rank of a node needs its own GPU. */
static gdp_status_t bind_device(struct gdp_comm *c, int exclusive) {
    int count = 0;
    GDP_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (count < 1)
        GDP_FAIL(GDP_STATUS_CUDA_ERROR, "gdp_comm_init: device buffers need a GPU, but none is visible on %s",
                 "this node (check CUDA_VISIBLE_DEVICES)");
    if (exclusive && c->node_size > count)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "gdp_comm_init: %d ranks share this node but only %d GPUs are visible; NCCL needs one GPU per "
                 "rank: start at most %d ranks per node, or use GDP_COMM_MPI (host-staged) to share GPUs",
                 c->node_size, count, count);
    c->device = c->node_rank % count;
    GDP_CUDA_CHECK(cudaSetDevice(c->device));
    return GDP_STATUS_SUCCESS;
}
#endif

/* The rank's place among the whole job's ranks on this node, from the launcher's environment
 * (Open MPI, MPICH/Hydra, SLURM): no communication, so a comm over a subset of the ranks can
 * be made without the others. Without one, the place within this comm's ranks on the node. */
static void job_node_rank(int comm_rank, int comm_size, int32_t *rank, int32_t *size) {
    static const char *const ranks[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    static const char *const sizes[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++) {
        const char *r = getenv(ranks[i]), *n = getenv(sizes[i]);
        if (r != NULL && n != NULL && atoi(n) > atoi(r) && atoi(r) >= 0) {
            *rank = atoi(r);
            *size = atoi(n);
            return;
        }
    }
    *rank = comm_rank;
    *size = comm_size;
}

/* The per-rank part of init that involves no backend: MPI duplicate, ranks, node-local rank. */
static gdp_status_t comm_setup_mpi(struct gdp_comm *c, MPI_Comm parent) {
    GDP_MPI_CHECK(MPI_Comm_dup(parent, &c->mpi));
    GDP_MPI_CHECK(MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN));
    int rank = 0, size = 0, world = 0;
    GDP_MPI_CHECK(MPI_Comm_rank(c->mpi, &rank));
    GDP_MPI_CHECK(MPI_Comm_size(c->mpi, &size));
    GDP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world));
    c->rank = rank;
    c->size = size;
    c->world_rank = world;
    MPI_Comm node = MPI_COMM_NULL;
    GDP_MPI_CHECK(MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    int local_rank = 0, local_size = 1;
    int e1 = MPI_Comm_rank(node, &local_rank), e2 = MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    GDP_MPI_CHECK(e1);
    GDP_MPI_CHECK(e2);
    c->local_rank = local_rank;
    c->local_size = local_size;
    job_node_rank(local_rank, local_size, &c->node_rank, &c->node_size);
    /* the watchdog's probe channel and peer table, before the first bounded wait */
    return gdp_watch_join(c);
}

gdp_status_t gdp_comm_init(gdp_comm_t *out, gdp_comm_backend_t backend, const void *mpi_comm,
                           gdp_comm_buffers_t buffers) {
    const char *fn = "gdp_comm_init";
    if (out == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if ((int)backend < 0 || backend >= GDP_COMM_BACKEND_NUM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: backend %d is not a gdp_comm_backend_t (GDP_COMM_MPI or "
                 "GDP_COMM_NCCL)", fn, (int)backend);
    if (buffers != GDP_COMM_HOST_BUFFERS && buffers != GDP_COMM_DEVICE_BUFFERS)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: buffers %d is neither GDP_COMM_HOST_BUFFERS nor "
                 "GDP_COMM_DEVICE_BUFFERS", fn, (int)buffers);
    if (!gdp_comm_backend_available(backend))
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: this libgdp was built without NCCL; rebuild with -DGDP_WITH_CUDA=ON "
                 "-DGDP_WITH_NCCL=ON, or use GDP_COMM_MPI", fn);
    if (backend == GDP_COMM_NCCL && buffers != GDP_COMM_DEVICE_BUFFERS)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: NCCL works on device memory only; pass "
                 "GDP_COMM_DEVICE_BUFFERS, or use GDP_COMM_MPI for host buffers", fn);
#ifndef GDP_HAVE_CUDA
    if (buffers == GDP_COMM_DEVICE_BUFFERS)
        GDP_FAIL(GDP_STATUS_UNSUPPORTED, "%s: device buffers need the CUDA backend, and this libgdp was built "
                 "without it; rebuild with -DGDP_WITH_CUDA=ON or pass GDP_COMM_HOST_BUFFERS", fn);
#endif
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        GDP_FAIL(GDP_STATUS_INVALID_USAGE, "%s: MPI is %s; call MPI_Init before gdp_comm_init and MPI_Finalize "
                 "after gdp_comm_free", fn, finalized ? "already finalized" : "not initialized");
    MPI_Comm parent = mpi_comm ? *(const MPI_Comm *)mpi_comm : MPI_COMM_WORLD;

    struct gdp_comm *c = gdp_calloc(1, sizeof *c, "gdp_comm");
    /* A failed calloc cannot skip the collectives below without hanging the peers, so
     * this rank still duplicates the communicator through a stack copy and reports. */
    struct gdp_comm stack_copy;
    struct gdp_comm *w = c ? c : &stack_copy;
    memset(w, 0, sizeof *w);
    w->mpi = MPI_COMM_NULL;
    w->watch = MPI_COMM_NULL;
    w->device = -1;
    w->backend = backend;
    w->buffers = buffers;
    gdp_status_t st = c ? GDP_STATUS_SUCCESS : GDP_STATUS_SYSTEM_ERROR;
    gdp_status_t setup = comm_setup_mpi(w, parent);
    if (st == GDP_STATUS_SUCCESS)
        st = setup;
    gdp_status_t config = gdp_watch_config(); /* a bad GDP_WATCHDOG_TIMEOUT fails init, agreed */
    if (st == GDP_STATUS_SUCCESS)
        st = config;
    if (w->mpi == MPI_COMM_NULL) {
        /* MPI_Comm_dup itself failed: without our communicator we cannot agree with the
         * peers; MPI_ERRORS_ARE_FATAL on the parent normally ended the job already. */
        free(c);
        return st;
    }
    gdp_set_error_rank(w->world_rank);
#ifdef GDP_HAVE_CUDA
    if (st == GDP_STATUS_SUCCESS && buffers == GDP_COMM_DEVICE_BUFFERS)
        st = bind_device(w, backend == GDP_COMM_NCCL);
#endif
    st = gdp_comm_agree_mpi(w, st);
    if (st == GDP_STATUS_SUCCESS) {
        /* Backends agree internally, so every rank leaves with the same status. */
        st = backend == GDP_COMM_NCCL ? gdp_comm_nccl_open(w) : gdp_comm_mpi_open(w);
    }
    if (st != GDP_STATUS_SUCCESS) {
        gdp_watch_leave(w);
        if (!gdp_watchdog_fired()) /* else MPI may still own operations on it */
            MPI_Comm_free(&w->mpi);
        free(c);
        return st;
    }
    c->magic = c->magic_end = GDP_COMM_MAGIC;
    *out = c;
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_comm_free(gdp_comm_t comm) {
    if (comm == NULL)
        return GDP_STATUS_SUCCESS;
    GDP_CHECK(comm_check(comm, "gdp_comm_free"));
    if (comm->iface.free)
        comm->iface.free(comm);
    gdp_watch_leave(comm);
    int err = MPI_SUCCESS;
    if (comm->mpi != MPI_COMM_NULL)
        err = MPI_Comm_free(&comm->mpi);
    comm->magic = comm->magic_end = 0;
    free(comm);
    GDP_MPI_CHECK(err);
    return GDP_STATUS_SUCCESS;
}

/* ---- queries ----------------------------------------------------------------------- */
#define COMM_GETTER(fn_name, type, field)                                                   \
    gdp_status_t fn_name(gdp_comm_t comm, type *value) {                                     \
        GDP_CHECK(comm_check(comm, #fn_name));                                               \
        if (value == NULL)                                                                   \
            GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: the out-pointer is NULL", #fn_name);  \
        *value = comm->field;                                                                \
        return GDP_STATUS_SUCCESS;                                                           \
    }
COMM_GETTER(gdp_comm_rank, int32_t, rank)
COMM_GETTER(gdp_comm_size, int32_t, size)
COMM_GETTER(gdp_comm_local_rank, int32_t, local_rank)
COMM_GETTER(gdp_comm_local_size, int32_t, local_size)
COMM_GETTER(gdp_comm_device, int32_t, device)
COMM_GETTER(gdp_comm_get_backend, gdp_comm_backend_t, backend)

gdp_status_t gdp_comm_name(gdp_comm_t comm, const char **name) {
    GDP_CHECK(comm_check(comm, "gdp_comm_name"));
    if (name == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_comm_name: the out-pointer is NULL");
    *name = comm->name;
    return GDP_STATUS_SUCCESS;
}

/* ---- collectives ------------------------------------------------------------------- */
static bool comm_dtype_ok(gdp_dtype_t dtype) {
    return dtype == GDP_DTYPE_FP32 || dtype == GDP_DTYPE_BF16 || dtype == GDP_DTYPE_FP16 ||
           dtype == GDP_DTYPE_INT32;
}

/* Checks shared by every collective: a live comm, a dtype, buffers present when count > 0. */
static gdp_status_t check_collective(gdp_comm_t comm, const char *fn, const void *send, const void *recv,
                                     size_t count, gdp_dtype_t dtype) {
    GDP_CHECK(comm_check_live(comm, fn));
    if (!comm_dtype_ok(dtype))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: dtype %d (%s) is not fp32, bf16, fp16 or int32", fn, (int)dtype,
                 gdp_dtype_name(dtype));
    if (count > 0 && (send == NULL || recv == NULL))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %s buffer is NULL with count = %zu", fn,
                 send == NULL ? "the send" : "the recv", count);
    if (count > (size_t)INT64_MAX / 8 / (size_t)comm->size)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: count = %zu times %d ranks overflows", fn, count, comm->size);
    return GDP_STATUS_SUCCESS;
}

/* Measured phases (src/phase.h): a collective on the recorded stream is a phase of its
 * own; what follows it is the layer's ops again. */
#define TIMED_COLLECTIVE(stream, call)                                                             \
    do {                                                                                           \
        gdp_phase_mark_stream((stream), GDP_MARK_COLLECTIVE);                                      \
        const gdp_status_t timed_st_ = (call);                                                     \
        gdp_phase_mark_stream((stream), GDP_MARK_OPS);                                             \
        return timed_st_;                                                                          \
    } while (0)

gdp_status_t gdp_comm_allreduce(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                                void *stream) {
    GDP_CHECK(check_collective(comm, "gdp_comm_allreduce", send, recv, count, dtype));
    TIMED_COLLECTIVE(stream, comm->iface.allreduce(comm, send, recv, count, dtype, stream));
}

gdp_status_t gdp_comm_allgather(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                                void *stream) {
    GDP_CHECK(check_collective(comm, "gdp_comm_allgather", send, recv, count, dtype));
    TIMED_COLLECTIVE(stream, comm->iface.allgather(comm, send, recv, count, dtype, stream));
}

gdp_status_t gdp_comm_reduce_scatter(gdp_comm_t comm, const void *send, void *recv, size_t recv_count,
                                     gdp_dtype_t dtype, void *stream) {
    GDP_CHECK(check_collective(comm, "gdp_comm_reduce_scatter", send, recv, recv_count, dtype));
    TIMED_COLLECTIVE(stream, comm->iface.reduce_scatter(comm, send, recv, recv_count, dtype, stream));
}

gdp_status_t gdp_comm_alltoall(gdp_comm_t comm, const void *send, void *recv, size_t count, gdp_dtype_t dtype,
                               void *stream) {
    GDP_CHECK(check_collective(comm, "gdp_comm_alltoall", send, recv, count, dtype));
    size_t bytes = count * (size_t)comm->size * gdp_dtype_size(dtype);
    const char *s = send, *r = recv;
    if (count > 0 && s < r + bytes && r < s + bytes)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_comm_alltoall: send and recv overlap (%zu bytes each); "
                 "alltoall is not in-place, pass separate buffers", bytes);
    TIMED_COLLECTIVE(stream, comm->iface.alltoall(comm, send, recv, count, dtype, stream));
}

gdp_status_t gdp_comm_bcast(gdp_comm_t comm, void *buf, size_t count, gdp_dtype_t dtype, int32_t root,
                            void *stream) {
    GDP_CHECK(check_collective(comm, "gdp_comm_bcast", buf, buf, count, dtype));
    if (root < 0 || root >= comm->size)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_comm_bcast: root = %d is outside [0, size = %d)", root,
                 comm->size);
    return comm->iface.bcast(comm, buf, count, dtype, root, stream);
}

gdp_status_t gdp_comm_barrier(gdp_comm_t comm, void *stream) {
    GDP_CHECK(comm_check_live(comm, "gdp_comm_barrier"));
    return comm->iface.barrier(comm, stream);
}

gdp_status_t gdp_comm_abort(gdp_comm_t comm) {
    GDP_CHECK(comm_check(comm, "gdp_comm_abort"));
    if (comm->aborted)
        return GDP_STATUS_SUCCESS;
    comm->aborted = 1;
    return comm->iface.abort(comm);
}

/* ---- host-side helpers ------------------------------------------------------------- */
/* A collective moving at least this many bytes for a rank (two 32 KB fragments of Open MPI's
 * shared-memory transport) starts only once every rank has arrived. */
enum { k_await_peers_bytes = 64 << 10 };

/* Open MPI moves a large message fragment by fragment, and only inside MPI calls on both
 * sides. A rank that arrived early has gone to sleeping between its polls (watchdog.c), so
 * a late peer's fragments would wait out those sleeps: a 16 MB allreduce of two ranks took
 * 35 ms instead of 3.6 ms when one rank came 50 ms late. So a large collective first waits,
 * free to sleep, for every rank at a barrier, and then moves its data with every rank
 * polling. The barrier costs one small message round (microseconds). */
gdp_status_t gdp_comm_await_peers(struct gdp_comm *comm, size_t bytes, const char *what) {
    if (bytes < k_await_peers_bytes || comm->size == 1)
        return GDP_STATUS_SUCCESS;
    MPI_Request req = MPI_REQUEST_NULL;
    GDP_MPI_CHECK(MPI_Ibarrier(comm->mpi, &req));
    return gdp_watch_wait(comm, &req, 0, what);
}

gdp_status_t gdp_comm_host_bcast(gdp_comm_t comm, void *buf, size_t bytes, int32_t root) {
    const char *fn = "gdp_comm_host_bcast";
    GDP_CHECK(comm_check_live(comm, fn));
    if (bytes > 0 && buf == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: buf is NULL with bytes = %zu", fn, bytes);
    if (root < 0 || root >= comm->size)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: root = %d is outside [0, size = %d)", fn, root, comm->size);
    if (bytes > (size_t)INT_MAX)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: %zu bytes exceed MPI's int count (%d); split the broadcast", fn,
                 bytes, INT_MAX);
    GDP_CHECK(gdp_comm_await_peers(comm, bytes, fn));
    MPI_Request req = MPI_REQUEST_NULL;
    GDP_MPI_CHECK(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, comm->mpi, &req));
    return gdp_watch_wait(comm, &req, bytes, fn);
}

/* 64-bit FNV-1a over the bytes, then the length, so equal prefixes of different lengths differ. */
static uint64_t fnv1a64(const void *data, size_t bytes) {
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    for (int i = 0; i < 8; i++)
        h = (h ^ (((uint64_t)bytes >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
    return h;
}

gdp_status_t gdp_comm_check_consistent(gdp_comm_t comm, const void *host_buf, size_t bytes, const char *what) {
    const char *fn = "gdp_comm_check_consistent";
    GDP_CHECK(comm_check_live(comm, fn));
    /* A NULL buffer on one rank must not skip the collectives, so it hashes as empty and
     * is reported after the agreement. */
    int bad_local = bytes > 0 && host_buf == NULL;
    uint64_t hash = fnv1a64(bad_local ? "" : host_buf, bad_local ? 0 : bytes);
    /* min of (hash, ~hash) in one all-reduce: the min and (complemented) the max; on the
     * heap, as the watchdog may leave them to MPI (gdp_comm_agree_mpi says why) */
    uint64_t *mm = malloc(4 * sizeof *mm);
    if (mm == NULL)
        GDP_FAIL(GDP_STATUS_SYSTEM_ERROR, "%s: out of memory", fn);
    mm[0] = hash, mm[1] = ~hash;
    MPI_Request req = MPI_REQUEST_NULL;
    int ierr = MPI_Iallreduce(mm, mm + 2, 2, MPI_UINT64_T, MPI_MIN, comm->mpi, &req);
    if (ierr != MPI_SUCCESS) {
        free(mm);
        return gdp_mpi_fail(ierr, "MPI_Iallreduce(hashes)", __FILE__, __LINE__);
    }
    GDP_CHECK(gdp_watch_wait(comm, &req, 0, fn));
    const uint64_t lo = mm[2], hi = ~mm[3];
    free(mm);
    if (bad_local)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: host_buf is NULL with bytes = %zu (checking %s)", fn, bytes,
                 what ? what : "?");
    if (lo == hi)
        return GDP_STATUS_SUCCESS;
    uint64_t *all = gdp_calloc((size_t)comm->size + 1, sizeof *all, "consistency hashes");
    /* without memory this rank still joins the gather (receiving nothing) so no peer hangs */
    static uint64_t lone[2];
    uint64_t *gather = all ? all : lone;
    gather[all ? comm->size : 0] = hash;
    int err = MPI_Iallgather(&gather[all ? comm->size : 0], 1, MPI_UINT64_T, all ? (void *)all : (void *)&lone[1],
                             all ? 1 : 0, MPI_UINT64_T, comm->mpi, &req);
    if (err == MPI_SUCCESS) {
        gdp_status_t wst = gdp_watch_wait(comm, &req, 0, fn);
        if (wst != GDP_STATUS_SUCCESS)
            return wst; /* its message; `all` stays MPI's */
    }
    char list[900] = "";
    size_t used = 0;
    for (int32_t r = 0; all && err == MPI_SUCCESS && r < comm->size && r < 8 && used < sizeof list; r++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%srank %d: %016llx", r ? ", " : "", r,
                                 (unsigned long long)all[r]);
    free(all);
    GDP_FAIL(GDP_STATUS_INVALID_USAGE,
             "%s: %s differs across the %d ranks (hashes %s%s); every rank must build it from the same inputs", fn,
             what ? what : "the buffer", comm->size, used ? list : "not gathered", comm->size > 8 ? ", ..." : "");
}

/* ---- tensor-parallel input / output ------------------------------------------------ */
const char *gdp_tp_mode_name(gdp_tp_mode_t mode) {
    switch (mode) {
    case GDP_TP_MODE_ALLREDUCE: return "allreduce";
    case GDP_TP_MODE_SEQUENCE_PARALLEL: return "sp";
    default: return "invalid";
    }
}

gdp_status_t gdp_tp_mode_parse(const char *text, gdp_tp_mode_t *mode) {
    if (text == NULL || mode == NULL)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_tp_mode_parse: text or mode is NULL");
    if (strcmp(text, "allreduce") == 0 || strcmp(text, "all-reduce") == 0) {
        *mode = GDP_TP_MODE_ALLREDUCE;
    } else if (strcmp(text, "sp") == 0 || strcmp(text, "sequence-parallel") == 0) {
        *mode = GDP_TP_MODE_SEQUENCE_PARALLEL;
    } else {
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "gdp_tp_mode_parse: '%s' is not a TP mode; use allreduce or sp", text);
    }
    return GDP_STATUS_SUCCESS;
}

static gdp_status_t check_tp_args(gdp_comm_t comm, const char *fn, gdp_tp_mode_t mode, int64_t tokens,
                                  int64_t hidden) {
    GDP_CHECK(comm_check_live(comm, fn));
    if ((int)mode < 0 || mode >= GDP_TP_MODE_NUM)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: mode %d is not a gdp_tp_mode_t", fn, (int)mode);
    if (tokens < 0 || hidden < 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: tokens = %lld and hidden = %lld must be >= 0", fn,
                 (long long)tokens, (long long)hidden);
    if (mode == GDP_TP_MODE_SEQUENCE_PARALLEL && tokens % comm->size != 0)
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT,
                 "%s: sequence parallel needs tokens = %lld divisible by the TP size %d; pad the step to a "
                 "multiple of %d tokens", fn, (long long)tokens, comm->size, comm->size);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_comm_tp_gather_input(gdp_comm_t comm, gdp_tp_mode_t mode, const void *x_local, void *x_full,
                                      int64_t tokens, int64_t hidden, gdp_dtype_t dtype, void *stream) {
    const char *fn = "gdp_comm_tp_gather_input";
    GDP_CHECK(check_tp_args(comm, fn, mode, tokens, hidden));
    if (mode == GDP_TP_MODE_SEQUENCE_PARALLEL)
        return gdp_comm_allgather(comm, x_local, x_full, (size_t)(tokens / comm->size * hidden), dtype, stream);
    size_t bytes = (size_t)(tokens * hidden) * gdp_dtype_size(dtype);
    if (!comm_dtype_ok(dtype))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: dtype %d is not fp32, bf16, fp16 or int32", fn, (int)dtype);
    if (bytes > 0 && (x_local == NULL || x_full == NULL))
        GDP_FAIL(GDP_STATUS_INVALID_ARGUMENT, "%s: x_local or x_full is NULL", fn);
    if (bytes == 0 || x_local == x_full)
        return GDP_STATUS_SUCCESS;
#ifdef GDP_HAVE_CUDA
    if (comm->buffers == GDP_COMM_DEVICE_BUFFERS) {
        GDP_CUDA_CHECK(cudaMemcpyAsync(x_full, x_local, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
        return GDP_STATUS_SUCCESS;
    }
#endif
    memmove(x_full, x_local, bytes);
    return GDP_STATUS_SUCCESS;
}

gdp_status_t gdp_comm_tp_reduce_output(gdp_comm_t comm, gdp_tp_mode_t mode, const void *partial, void *out,
                                       int64_t tokens, int64_t hidden, gdp_dtype_t dtype, void *stream) {
    GDP_CHECK(check_tp_args(comm, "gdp_comm_tp_reduce_output", mode, tokens, hidden));
    if (mode == GDP_TP_MODE_SEQUENCE_PARALLEL)
        return gdp_comm_reduce_scatter(comm, partial, out, (size_t)(tokens / comm->size * hidden), dtype, stream);
    return gdp_comm_allreduce(comm, partial, out, (size_t)(tokens * hidden), dtype, stream);
}

/* ---- the fatal path ---------------------------------------------------------------- */
static gdp_abort_callback_t g_abort_callback;
static void *g_abort_user_data;

gdp_status_t gdp_set_abort_callback(gdp_abort_callback_t callback, void *user_data) {
    g_abort_callback = callback;
    g_abort_user_data = user_data;
    return GDP_STATUS_SUCCESS;
}

void gdp_fatal(gdp_comm_t comm, const char *file, int line, const char *fmt, ...) {
    char message[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    int initialized = 0, finalized = 0, rank = -1;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    bool mpi_live = initialized && !finalized;
    if (mpi_live)
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *base = file ? strrchr(file, '/') : NULL;
    base = base ? base + 1 : (file ? file : "?");
    fprintf(stderr, "%s:%d %s:%d %s\n", host, rank, base, line, message);
    fflush(stderr);
    fflush(stdout);
    if (g_abort_callback)
        g_abort_callback(g_abort_user_data);
    /* Abort the comm first, so NCCL kernels stop waiting on peers, then end every rank. */
    if (comm != NULL && comm->magic == GDP_COMM_MAGIC && comm->magic_end == GDP_COMM_MAGIC && !comm->aborted) {
        comm->aborted = 1;
        (void)comm->iface.abort(comm);
    }
    if (mpi_live)
        MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1); /* MPI_Abort does not return; without MPI, this process is the whole job */
}
