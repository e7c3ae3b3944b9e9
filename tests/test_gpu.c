/*
 * test_gpu.c: the GPU tests' shared helpers (see test_gpu.h): GPU usability and the skip on
 * every rank, a one-process GPU test's main and its job's contexts and stream, device copies of
 * tensor views, and graph capture and replay.
 */
#include "test_gpu.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* defines: gdp_tensor_present */

int test_gpu_usable(char *why, size_t n, int *gpus) {
    *gpus = 0;
#ifdef GDP_HAVE_CUDA
    if (!gdp_backend_available(GDP_BACKEND_CUDA)) {
        snprintf(why, n, "this libgdp has no CUDA backend");
        return 0;
    }
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count < 1) {
        (void)cudaGetLastError();
        snprintf(why, n, "no GPU visible (%s)", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 0;
    }
    *gpus = count;
    return 1;
#else
    snprintf(why, n, "this libgdp was built without CUDA");
    return 0;
#endif
}

bool test_gpu_all_ranks_usable(int usable, const char *name, const char *why) {
    int all = 0, rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Allreduce(&usable, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all && !usable)
        printf("%s: skipped on rank %d: %s\n", name, rank, why);
    return all != 0;
}

int test_gpu_main(const char *name, void (*tests)(test_rng *rng), uint64_t seed) {
#ifdef GDP_HAVE_CUDA
    if (!test_gpu_present(name))
        return TEST_SKIP;
    if (!test_gpu_job_init())
        return test_finish(name);
    test_rng rng;
    test_rng_seed(&rng, seed);
    tests(&rng);
    test_gpu_job_free();
    return test_finish(name);
#else
    (void)tests, (void)seed;
    printf("%s: skipped: this libgdp was built without the CUDA backend\n", name);
    return TEST_SKIP;
#endif
}

#ifdef GDP_HAVE_CUDA

bool test_gpu_present(const char *name) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        printf("%s: skipped: no CUDA device (%s)\n", name, err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return false;
    }
    return true;
}

gdp_ctx_t g_test_gpu, g_test_cpu;
cudaStream_t g_test_stream;

bool test_gpu_job_init(void) {
    CHECK_OK(gdp_ctx_init(&g_test_gpu, GDP_BACKEND_CUDA, 0));
    CHECK_OK(gdp_ctx_init(&g_test_cpu, GDP_BACKEND_CPU, 0));
    if (g_test_gpu == NULL || g_test_cpu == NULL)
        return false;
    CUDA_OK(cudaStreamCreate(&g_test_stream));
    CHECK_OK(gdp_ctx_set_stream(g_test_gpu, g_test_stream));
    return true;
}

void test_gpu_job_free(void) {
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaStreamDestroy(g_test_stream));
    g_test_stream = NULL;
    gdp_ctx_free(g_test_gpu);
    gdp_ctx_free(g_test_cpu);
}

/* ---- device copies ------------------------------------------------------------------------ */
/* Empty views still get a (small) allocation, so their data pointer is present. */
static void *dev_bytes(size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

gdp_tensor test_dev_clone(const gdp_tensor *h) {
    gdp_tensor d = *h;
    d.data = NULL;
    if (!gdp_tensor_present(h))
        return d;
    const size_t b = test_span_bytes(h);
    d.data = dev_bytes(b);
    CUDA_OK(cudaMemcpy(d.data, h->data, b, cudaMemcpyHostToDevice));
    return d;
}

gdp_tensor test_dev_filled(const gdp_tensor *h, int byte) {
    gdp_tensor d = *h;
    const size_t b = test_span_bytes(h);
    d.data = dev_bytes(b);
    CUDA_OK(cudaMemset(d.data, byte, b));
    return d;
}

gdp_tensor test_dev_poisoned(const gdp_tensor *h) { return test_dev_filled(h, TEST_SENTINEL_BYTE); }

gdp_tensor test_dev_alloc(gdp_dtype_t dtype, int32_t ndim, const int64_t *shape, int byte) {
    gdp_tensor t;
    gdp_tensor_init(&t, NULL, dtype, ndim, shape);
    return test_dev_filled(&t, byte);
}

gdp_tensor test_dev_upload(const gdp_tensor *h) {
    if (!gdp_tensor_present(h)) {
        gdp_tensor none;
        memset(&none, 0, sizeof none);
        return none;
    }
    gdp_tensor d = test_dev_alloc(h->dtype, h->ndim, h->shape, 0);
    CUDA_OK(cudaMemcpy(d.data, h->data, test_tensor_bytes(h), cudaMemcpyHostToDevice));
    return d;
}

void test_dev_put(gdp_tensor *d, const gdp_tensor *h) {
    CUDA_OK(cudaMemcpy(d->data, h->data, test_span_bytes(h), cudaMemcpyHostToDevice));
}

void test_dev_fetch(gdp_tensor *h, const gdp_tensor *d) {
    CUDA_OK(cudaStreamSynchronize(g_test_stream));
    CUDA_OK(cudaMemcpy(h->data, d->data, test_span_bytes(h), cudaMemcpyDeviceToHost));
}

gdp_tensor test_dev_download(const gdp_tensor *d) {
    gdp_tensor h = test_tensor_alloc(d->dtype, d->ndim, d->shape);
    CUDA_OK(cudaMemcpy(h.data, d->data, test_tensor_bytes(d), cudaMemcpyDeviceToHost));
    return h;
}

void test_dev_free(gdp_tensor *d) {
    if (d->data != NULL)
        CUDA_OK(cudaFree(d->data));
    d->data = NULL;
}

/* ---- CUDA graphs -------------------------------------------------------------------------- */
cudaGraphExec_t test_graph_capture(test_op_fn fn, void *args) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CUDA_OK(cudaStreamBeginCapture(g_test_stream, cudaStreamCaptureModeGlobal));
    const gdp_status_t st = fn(args);
    CHECK(st == GDP_STATUS_SUCCESS, "op inside graph capture failed: %s", gdp_last_error());
    CUDA_OK(cudaStreamEndCapture(g_test_stream, &graph));
    if (graph != NULL) {
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_OK(cudaGraphDestroy(graph));
    }
    return exec;
}

void test_graph_replay(cudaGraphExec_t exec) {
    if (exec != NULL)
        CUDA_OK(cudaGraphLaunch(exec, g_test_stream));
    CUDA_OK(cudaStreamSynchronize(g_test_stream));
}

#endif /* GDP_HAVE_CUDA */
