/*
 * test_comm_mpi.c: the MPI comm backend under mpirun (2 and 4 ranks), nccl-tests style.
 * Each collective (allreduce, allgather, reduce_scatter, alltoall, bcast; in place and
 * out of place) runs on per-rank seeded data (seed = base + 33*rep + rank) for every
 * dtype and several counts, and is compared with the result every rank computes on the
 * host from all ranks' seeds. The values make every sum over ranks exact in fp32 but most
 * of them inexact in bf16/fp16, and the MPI backend sums 16-bit data in fp32 and rounds
 * once, so the expected result is the exact sum rounded once to the dtype and the
 * comparison is bitwise (this also checks the rounding). Also: the TP input/output helpers in both modes, status agreement,
 * consistency hashes, and bad arguments. At the largest count the last rank arrives late
 * at every collective (the backend's wait for every rank before a large transfer).
 * With --device (test_comm_mpi_gpu_np2; skipped without a GPU on every rank): device buffers
 * on a non-blocking stream, host-staged, in chains of collectives with no host wait between
 * them (each result is copied back in stream order, and the next collective reuses the
 * staging): the results read back once at the end of a chain, bitwise. Wrong-element counts are summed over ranks
 * with MPI_Allreduce so every rank exits the same way.
 */
#include <mpi.h>
#include <string.h>
#include <unistd.h> /* usleep */

#include "gdp/comm.h"
#include "internal.h" /* defines: gdp_store_elem, gdp_set_error */
#include "test_common.h"
#include "test_gpu.h" /* defines: test_gpu_usable, CUDA_OK */

static int g_rank, g_size;

/* The value rank `r` holds at element i of buffer `rep`. Floats: k * 2^-e with k an
 * integer in [-128, 128) and e in [0, 8], so every value is exact in bf16 and fp16, sums
 * of a few of them are exact in fp32 (they span at most 16 bits), but most sums are not
 * representable in 16 bits: the expected 16-bit result is one rounding of the exact sum.
 * int32: k itself. */
static double seeded_value(gdp_dtype_t dt, int rep, int r, size_t i) {
    test_rng rng;
    test_rng_seed(&rng, 1000u + 33u * (uint64_t)rep + (uint64_t)r + 7919u * (uint64_t)i);
    double k = (double)((int)(test_uniform(&rng) * 256.0) - 128);
    int e = (int)(test_uniform(&rng) * 9.0);
    return dt == GDP_DTYPE_INT32 ? k : ldexp(k, -e);
}

static void fill(void *buf, gdp_dtype_t dt, int rep, int r, size_t n, size_t first) {
    for (size_t i = 0; i < n; i++)
        gdp_store_elem(buf, dt, (int64_t)i, seeded_value(dt, rep, r, first + i));
}

/* Number of elements whose bits differ from `want` (values stored in dtype). */
static int64_t count_wrong(const void *got, const void *want, gdp_dtype_t dt, size_t n) {
    size_t es = gdp_dtype_size(dt);
    int64_t wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += memcmp((const char *)got + i * es, (const char *)want + i * es, es) != 0;
    return wrong;
}

/* The exact sum over ranks of element i, rounded once to the dtype. */
static void expected_sum(void *dst, gdp_dtype_t dt, int rep, size_t n, size_t first) {
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (int r = 0; r < g_size; r++)
            s += seeded_value(dt, rep, r, first + i);
        gdp_store_elem(dst, dt, (int64_t)i, s);
    }
}

static void report(const char *op, gdp_dtype_t dt, size_t count, int in_place, int64_t wrong) {
    int64_t total = 0;
    MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("%16s %6s %8zu %8s %8lld\n", op, gdp_dtype_name(dt), count, in_place ? "in" : "out", (long long)total);
    CHECK(total == 0, "%s %s count %zu (%s-place): %lld wrong elements over %d ranks", op, gdp_dtype_name(dt), count,
          in_place ? "in" : "out", (long long)total, g_size);
}

/* The last rank arriving 20 ms after the others at a collective of `late_count` elements or
 * more: from 64 KB on the MPI backend first waits for every rank (gdp_comm_await_peers, comm.c). */
static const size_t late_count = 70000;
static void arrive(size_t count) {
    if (count >= late_count && g_rank == g_size - 1)
        usleep(20000);
}

static void test_collectives(gdp_comm_t comm, gdp_dtype_t dt, size_t count, int rep) {
    const size_t es = gdp_dtype_size(dt), P = (size_t)g_size;
    char *send = calloc(count * P + 1, es), *recv = calloc(count * P + 1, es), *want = calloc(count * P + 1, es);

    /* allreduce, out of place and in place */
    for (int in_place = 0; in_place < 2; in_place++) {
        fill(send, dt, rep, g_rank, count, 0);
        expected_sum(want, dt, rep, count, 0);
        memset(recv, 0xff, count * es);
        arrive(count);
        CHECK_OK(gdp_comm_allreduce(comm, send, in_place ? send : recv, count, dt, NULL));
        report("allreduce", dt, count, in_place, count_wrong(in_place ? send : recv, want, dt, count));
    }
    /* allgather: rank r's block is its own data; in place when send is recv's block `rank` */
    for (int in_place = 0; in_place < 2; in_place++) {
        memset(recv, 0xff, count * P * es);
        char *src = in_place ? recv + (size_t)g_rank * count * es : send;
        fill(src, dt, rep, g_rank, count, 0);
        for (int r = 0; r < g_size; r++)
            fill(want + (size_t)r * count * es, dt, rep, r, count, 0);
        arrive(count);
        CHECK_OK(gdp_comm_allgather(comm, src, recv, count, dt, NULL));
        report("allgather", dt, count, in_place, count_wrong(recv, want, dt, count * P));
    }
    /* reduce_scatter: block r of the sum lands on rank r */
    for (int in_place = 0; in_place < 2; in_place++) {
        fill(send, dt, rep, g_rank, count * P, 0);
        expected_sum(want, dt, rep, count, (size_t)g_rank * count);
        char *dst = in_place ? send + (size_t)g_rank * count * es : recv;
        if (!in_place)
            memset(recv, 0xff, count * es);
        arrive(count);
        CHECK_OK(gdp_comm_reduce_scatter(comm, send, dst, count, dt, NULL));
        report("reduce_scatter", dt, count, in_place, count_wrong(dst, want, dt, count));
    }
    /* alltoall: rank r's block p goes to rank p; block p of the data at rank r is rep's
     * element range [p*count, (p+1)*count) of rank r */
    fill(send, dt, rep, g_rank, count * P, 0);
    memset(recv, 0xff, count * P * es);
    for (int r = 0; r < g_size; r++)
        fill(want + (size_t)r * count * es, dt, rep, r, count, (size_t)g_rank * count);
    arrive(count);
    CHECK_OK(gdp_comm_alltoall(comm, send, recv, count, dt, NULL));
    report("alltoall", dt, count, 0, count_wrong(recv, want, dt, count * P));
    /* bcast from every root */
    int64_t wrong = 0;
    for (int root = 0; root < g_size; root++) {
        if (g_rank == root)
            fill(send, dt, rep, root, count, 0);
        else
            memset(send, 0xff, count * es);
        fill(want, dt, rep, root, count, 0);
        arrive(count);
        CHECK_OK(gdp_comm_bcast(comm, send, count, dt, root, NULL));
        wrong += count_wrong(send, want, dt, count);
    }
    report("bcast", dt, count, 1, wrong);
    free(send);
    free(recv);
    free(want);
}

/* The TP helpers: all-reduce mode vs sequence parallel (all-gather / reduce-scatter by tokens). */
static void test_tp_modes(gdp_comm_t comm) {
    const int64_t hidden = 5, tokens = 4 * (int64_t)g_size;
    const gdp_dtype_t dt = GDP_DTYPE_FP32;
    const size_t full = (size_t)(tokens * hidden), part = full / (size_t)g_size;
    float *partial = calloc(full, 4), *out = calloc(full, 4), *want = calloc(full, 4), *x_full = calloc(full, 4);
    fill(partial, dt, 7, g_rank, full, 0);
    expected_sum(want, dt, 7, full, 0);
    CHECK_OK(gdp_comm_tp_reduce_output(comm, GDP_TP_MODE_ALLREDUCE, partial, out, tokens, hidden, dt, NULL));
    report("tp_out allreduce", dt, full, 0, count_wrong(out, want, dt, full));
    memset(out, 0xff, full * 4);
    CHECK_OK(gdp_comm_tp_reduce_output(comm, GDP_TP_MODE_SEQUENCE_PARALLEL, partial, out, tokens, hidden, dt, NULL));
    report("tp_out sp", dt, part, 0, count_wrong(out, want + (size_t)g_rank * part, dt, part));
    /* SP input: each rank's token block is gathered in rank order */
    fill(out, dt, 8, g_rank, part, 0);
    for (int r = 0; r < g_size; r++)
        fill(want + (size_t)r * part, dt, 8, r, part, 0);
    CHECK_OK(gdp_comm_tp_gather_input(comm, GDP_TP_MODE_SEQUENCE_PARALLEL, out, x_full, tokens, hidden, dt, NULL));
    report("tp_in sp", dt, full, 0, count_wrong(x_full, want, dt, full));
    /* all-reduce mode: the replicated input is just copied */
    fill(partial, dt, 9, 0, full, 0);
    memset(x_full, 0, full * 4);
    CHECK_OK(gdp_comm_tp_gather_input(comm, GDP_TP_MODE_ALLREDUCE, partial, x_full, tokens, hidden, dt, NULL));
    report("tp_in allreduce", dt, full, 0, count_wrong(x_full, partial, dt, full));
    /* a token count not divisible by the TP size is refused on every rank, naming both */
    if (g_size > 1) {
        CHECK_STATUS(gdp_comm_tp_reduce_output(comm, GDP_TP_MODE_SEQUENCE_PARALLEL, partial, out, tokens + 1, hidden,
                                               dt, NULL),
                     GDP_STATUS_INVALID_ARGUMENT);
        char needle[64];
        snprintf(needle, sizeof needle, "tokens = %lld divisible by the TP size %d", (long long)(tokens + 1), g_size);
        CHECK(strstr(gdp_last_error(), needle) != NULL, "message '%s' lacks '%s'", gdp_last_error(), needle);
    }
    gdp_tp_mode_t mode;
    CHECK_OK(gdp_tp_mode_parse("sp", &mode));
    CHECK(mode == GDP_TP_MODE_SEQUENCE_PARALLEL, "'sp' parsed as %d", (int)mode);
    CHECK_STATUS(gdp_tp_mode_parse("ring", &mode), GDP_STATUS_INVALID_ARGUMENT);
    free(partial);
    free(out);
    free(want);
    free(x_full);
}

static void test_agreement(gdp_comm_t comm) {
    /* nobody fails */
    CHECK_OK(gdp_comm_agree(comm, GDP_STATUS_SUCCESS));
    /* the last rank fails: it keeps its status, every other rank learns who failed and why */
    int failing = g_size - 1;
    gdp_status_t local = GDP_STATUS_SUCCESS;
    if (g_rank == failing)
        local = gdp_set_error(GDP_STATUS_INVALID_ARGUMENT, __FILE__, __LINE__, "tensor 'layers.0.A_log' missing");
    gdp_status_t st = gdp_comm_agree(comm, local);
    if (g_rank == failing) {
        CHECK(st == GDP_STATUS_INVALID_ARGUMENT, "failing rank got %d", (int)st);
    } else {
        char needle[32];
        snprintf(needle, sizeof needle, "rank %d failed", failing);
        CHECK(st == GDP_STATUS_REMOTE_ERROR, "rank %d got %d, expected REMOTE_ERROR", g_rank, (int)st);
        CHECK(strstr(gdp_last_error(), needle) != NULL && strstr(gdp_last_error(), "layers.0.A_log") != NULL,
              "message '%s' names neither the failing rank nor its error", gdp_last_error());
    }
    /* consistency: identical bytes pass, rank-dependent bytes fail on every rank */
    int32_t same[8] = {1, 2, 3, 4, 5, 6, 7, 8}, differ[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    differ[3] += g_rank;
    CHECK_OK(gdp_comm_check_consistent(comm, same, sizeof same, "the step plan"));
    if (g_size > 1) {
        CHECK_STATUS(gdp_comm_check_consistent(comm, differ, sizeof differ, "the step plan"),
                     GDP_STATUS_INVALID_USAGE);
        CHECK(strstr(gdp_last_error(), "the step plan differs across") != NULL && strstr(gdp_last_error(), "rank 1:"),
              "message '%s' does not name what differs and the ranks' hashes", gdp_last_error());
    }
    /* host broadcast of a plan-like struct */
    int64_t plan[3] = {0, 0, 0};
    if (g_rank == 0) {
        plan[0] = 11;
        plan[1] = 22;
        plan[2] = 33;
    }
    CHECK_OK(gdp_comm_host_bcast(comm, plan, sizeof plan, 0));
    CHECK(plan[0] == 11 && plan[1] == 22 && plan[2] == 33, "host_bcast gave %lld %lld %lld", (long long)plan[0],
          (long long)plan[1], (long long)plan[2]);
}

static void test_bad_arguments(gdp_comm_t comm) {
    float x[4] = {0};
    CHECK_STATUS(gdp_comm_allreduce(comm, NULL, x, 4, GDP_DTYPE_FP32, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_comm_allreduce(comm, x, x, 4, GDP_DTYPE_NUM, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_comm_bcast(comm, x, 4, GDP_DTYPE_FP32, g_size, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(gdp_last_error(), "root") != NULL, "bcast message '%s' does not name the root", gdp_last_error());
    CHECK_STATUS(gdp_comm_alltoall(comm, x, x, 1, GDP_DTYPE_FP32, NULL), GDP_STATUS_INVALID_ARGUMENT);
    CHECK_STATUS(gdp_comm_allreduce(NULL, x, x, 4, GDP_DTYPE_FP32, NULL), GDP_STATUS_INVALID_ARGUMENT);
    /* a count too large for one MPI call is refused before anything is sent */
    CHECK_STATUS(gdp_comm_allreduce(comm, x, x, (size_t)1 << 40, GDP_DTYPE_FP32, NULL), GDP_STATUS_INVALID_ARGUMENT);
    gdp_comm_t other = NULL;
    CHECK_STATUS(gdp_comm_init(&other, GDP_COMM_BACKEND_NUM, NULL, GDP_COMM_HOST_BUFFERS),
                 GDP_STATUS_INVALID_ARGUMENT);
    CHECK(other == NULL, "a failed init left a handle");
    if (!gdp_comm_backend_available(GDP_COMM_NCCL))
        CHECK_STATUS(gdp_comm_init(&other, GDP_COMM_NCCL, NULL, GDP_COMM_DEVICE_BUFFERS), GDP_STATUS_UNSUPPORTED);
    CHECK_STATUS(gdp_comm_init(&other, GDP_COMM_NCCL, NULL, GDP_COMM_HOST_BUFFERS),
                 gdp_comm_backend_available(GDP_COMM_NCCL) ? GDP_STATUS_INVALID_ARGUMENT : GDP_STATUS_UNSUPPORTED);
    if (!gdp_backend_available(GDP_BACKEND_CUDA))
        CHECK_STATUS(gdp_comm_init(&other, GDP_COMM_MPI, NULL, GDP_COMM_DEVICE_BUFFERS), GDP_STATUS_UNSUPPORTED);
}

#ifdef GDP_HAVE_CUDA
/* Host data up to the device, a device buffer back to the host: on `stream`, waited for. */
static void *to_device(const void *host, size_t bytes, cudaStream_t stream) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes ? bytes : 1));
    CUDA_OK(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    return d;
}

/* Two chains a (dtype, count), each enqueued without a host wait and read back at its end:
 * allreduce -> allgather of the sum (every block the sum), and reduce_scatter -> bcast of
 * root 0's block (every rank root 0's block of the sum). */
static void test_device_chains(gdp_comm_t comm, cudaStream_t stream, gdp_dtype_t dt, size_t count, int rep) {
    const size_t es = gdp_dtype_size(dt), P = (size_t)g_size, n = count * P;
    char *host = calloc(n + 1, es), *want = calloc(n + 1, es), *got = calloc(n + 1, es);
    /* chain 1 */
    fill(host, dt, rep, g_rank, count, 0);
    expected_sum(want, dt, rep, count, 0);
    void *d_send = to_device(host, count * es, stream), *d_sum = NULL, *d_all = NULL;
    CUDA_OK(cudaMalloc(&d_sum, count * es + 1));
    CUDA_OK(cudaMalloc(&d_all, n * es + 1));
    arrive(count);
    CHECK_OK(gdp_comm_allreduce(comm, d_send, d_sum, count, dt, stream));
    CHECK_OK(gdp_comm_allgather(comm, d_sum, d_all, count, dt, stream));
    CUDA_OK(cudaMemcpyAsync(got, d_all, n * es, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    int64_t wrong = 0;
    for (size_t r = 0; r < P; r++)
        wrong += count_wrong(got + r * count * es, want, dt, count);
    report("dev allreduce+allgather", dt, count, 0, wrong);
    /* chain 2 */
    fill(host, dt, rep, g_rank, n, 0);
    expected_sum(want, dt, rep, count, 0); /* root 0's block of the sum */
    void *d_big = to_device(host, n * es, stream);
    arrive(count);
    CHECK_OK(gdp_comm_reduce_scatter(comm, d_big, d_sum, count, dt, stream));
    CHECK_OK(gdp_comm_bcast(comm, d_sum, count, dt, 0, stream));
    CUDA_OK(cudaMemcpyAsync(got, d_sum, count * es, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    report("dev reduce_scatter+bcast", dt, count, 0, count_wrong(got, want, dt, count));
    CUDA_OK(cudaFree(d_send));
    CUDA_OK(cudaFree(d_sum));
    CUDA_OK(cudaFree(d_all));
    CUDA_OK(cudaFree(d_big));
    free(host);
    free(want);
    free(got);
}
#endif

/* --device: the host-staged device path; TEST_SKIP on every rank without a GPU on each. */
static int device_main(void) {
#ifdef GDP_HAVE_CUDA
    char why[160] = "";
    int gpus = 0;
    const int usable = test_gpu_usable(why, sizeof why, &gpus);
    if (!test_gpu_all_ranks_usable(usable, "test_comm_mpi --device", why))
        return TEST_SKIP;
    gdp_comm_t comm = NULL;
    GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&comm, GDP_COMM_MPI, NULL, GDP_COMM_DEVICE_BUFFERS));
    const char *name = NULL;
    CHECK_OK(gdp_comm_name(comm, &name));
    if (g_rank == 0) {
        printf("# gdp comm test: %d ranks, backend %s\n", g_size, name);
        printf("#%23s %6s %8s %8s %8s\n", "op", "dtype", "count", "place", "#wrong");
    }
    cudaStream_t stream = NULL;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const gdp_dtype_t dtypes[] = {GDP_DTYPE_FP32, GDP_DTYPE_BF16, GDP_DTYPE_INT32};
    const size_t counts[] = {1, 1000, late_count};
    int rep = 0;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            test_device_chains(comm, stream, dtypes[d], counts[c], rep++);
    CHECK_OK(gdp_comm_free(comm));
    CUDA_OK(cudaStreamDestroy(stream));
    return 0;
#else
    if (g_rank == 0)
        printf("test_comm_mpi --device: skipped: this libgdp was built without CUDA\n");
    return TEST_SKIP;
#endif
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (argc > 1 && strcmp(argv[1], "--device") == 0) {
        const int code = device_main();
        int failures = 0;
        MPI_Allreduce(&g_test_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (code != TEST_SKIP && g_rank == 0)
            test_finish("test_comm_mpi --device");
        MPI_Finalize();
        return code == TEST_SKIP ? TEST_SKIP : failures ? 1 : 0;
    }
    gdp_comm_t comm = NULL;
    GDP_FATAL_IF_ERROR(NULL, gdp_comm_init(&comm, GDP_COMM_MPI, NULL, GDP_COMM_HOST_BUFFERS));
    int32_t rank = -1, size = -1, local_rank = -1, local_size = -1, device = 0;
    const char *name = NULL;
    CHECK_OK(gdp_comm_rank(comm, &rank));
    CHECK_OK(gdp_comm_size(comm, &size));
    CHECK_OK(gdp_comm_local_rank(comm, &local_rank));
    CHECK_OK(gdp_comm_local_size(comm, &local_size));
    CHECK_OK(gdp_comm_device(comm, &device));
    CHECK_OK(gdp_comm_name(comm, &name));
    CHECK(rank == g_rank && size == g_size, "comm rank/size %d/%d, MPI says %d/%d", rank, size, g_rank, g_size);
    /* mpirun on one machine: every rank is node-local */
    CHECK(local_size == g_size && local_rank == g_rank, "local rank/size %d/%d", local_rank, local_size);
    CHECK(device == -1, "host comm bound device %d", device);
    if (g_rank == 0) {
        printf("# gdp comm test: %d ranks, backend %s\n", g_size, name);
        printf("#%15s %6s %8s %8s %8s\n", "op", "dtype", "count", "place", "#wrong");
    }
    const gdp_dtype_t dtypes[] = {GDP_DTYPE_FP32, GDP_DTYPE_BF16, GDP_DTYPE_FP16, GDP_DTYPE_INT32};
    const size_t counts[] = {0, 1, 7, 1000, 40000, late_count};
    int rep = 0;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            test_collectives(comm, dtypes[d], counts[c], rep++);
    test_tp_modes(comm);
    test_agreement(comm);
    test_bad_arguments(comm);
    /* after an abort only free is valid */
    gdp_comm_t doomed = NULL;
    GDP_FATAL_IF_ERROR(comm, gdp_comm_init(&doomed, GDP_COMM_MPI, NULL, GDP_COMM_HOST_BUFFERS));
    CHECK_OK(gdp_comm_abort(doomed));
    float one = 1;
    CHECK_STATUS(gdp_comm_allreduce(doomed, &one, &one, 1, GDP_DTYPE_FP32, NULL), GDP_STATUS_INVALID_USAGE);
    CHECK_OK(gdp_comm_free(doomed));
    CHECK_OK(gdp_comm_free(comm));

    int failures = 0;
    MPI_Allreduce(&g_test_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0)
        printf("# Out of bounds values : %d %s\n", failures, failures ? "FAILED" : "OK");
    int code = failures ? 1 : 0;
    if (g_rank == 0)
        code = test_finish(g_size == 2 ? "test_comm_mpi_np2" : "test_comm_mpi");
    else if (g_test_failures)
        test_finish("test_comm_mpi");
    MPI_Finalize();
    return failures ? 1 : code;
}
